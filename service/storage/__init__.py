"""Artifact store: job folders on a local (or shared, mounted) filesystem."""

from service.storage.local import ArtifactStore, artifact_kind, sha256_file

__all__ = ["ArtifactStore", "artifact_kind", "sha256_file"]
