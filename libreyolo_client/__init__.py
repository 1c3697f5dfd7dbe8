"""Python SDK of the LibreYOLO training service (httpx + pydantic; no torch).

Example::

    from libreyolo_client import Client

    with Client() as c:                     # URL and token from LIBREYOLO_URL/_TOKEN or
        job = c.train(model="yolo9-t",      # the file `libreyolo-service up` writes
                      data="/data/coco128/coco128.yaml", epochs=10, imgsz=320)
        info = job.wait(progress=True)      # follows the event stream; JobFailed on failure
        print(job.metrics["mAP50-95"])     # job.status == JobStatus.SUCCEEDED
        job.download("weights/best.pt", "models/")
"""

from libreyolo_client._async import AsyncClient, AsyncJob
from libreyolo_client._client import Client, Job
from libreyolo_client._errors import (
    APIError,
    AuthError,
    ChecksumError,
    Conflict,
    ExportFailed,
    JobCancelled,
    JobError,
    JobFailed,
    LibreYOLOError,
    NotFound,
    ServiceUnavailable,
    SubmitWarning,
    ValidationError,
    WaitTimeout,
)
from libreyolo_client._models import (
    ArtifactInfo,
    Box,
    DatasetInfo,
    Event,
    JobInfo,
    JobStatus,
    Model,
    NodeWorker,
    OnnxExport,
    Preflight,
    PreflightActual,
    ReportImage,
    ReportRow,
    TuneReport,
    TuneRow,
    ValReport,
)

__all__ = [
    "APIError",
    "ArtifactInfo",
    "AsyncClient",
    "AsyncJob",
    "AuthError",
    "Box",
    "ChecksumError",
    "Client",
    "Conflict",
    "DatasetInfo",
    "Event",
    "ExportFailed",
    "Job",
    "JobCancelled",
    "JobError",
    "JobFailed",
    "JobInfo",
    "JobStatus",
    "LibreYOLOError",
    "Model",
    "NodeWorker",
    "NotFound",
    "OnnxExport",
    "Preflight",
    "PreflightActual",
    "ReportImage",
    "ReportRow",
    "ServiceUnavailable",
    "SubmitWarning",
    "TuneReport",
    "TuneRow",
    "ValReport",
    "ValidationError",
    "WaitTimeout",
]
