"""Database: SQLAlchemy 2 models, engine/session factory, Alembic migrations."""

from service.db.models import Artifact, Base, Dataset, Job, JobEvent, Model, Token, User
from service.db.session import make_engine, make_session_factory

__all__ = [
    "Artifact", "Base", "Dataset", "Job", "JobEvent", "Model", "Token", "User",
    "make_engine", "make_session_factory",
]
