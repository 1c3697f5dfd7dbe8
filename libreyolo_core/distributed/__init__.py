"""Multi-device training: device parsing, the process group, the global batch, autobatch
and the spawn launcher (docs/architecture.md, "Multi-device")."""
