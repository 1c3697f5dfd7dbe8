"""YOLOv9: ``family.py`` (the contract, torch-free), ``nn.py`` (network), ``loss.py``."""
