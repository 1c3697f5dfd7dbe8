"""Device selection and (with the DDP issue) the spawn and torchrun launch paths."""
