"""What the /v1/files and /v1/batches routes and the batch worker share, opened once per gateway."""

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from maas_services.gateway.batches.batch_store import BatchStore
from maas_services.gateway.batches.blob_store import DirectoryBlobStore
from maas_services.gateway.batches.file_store import FileLimits, FileStore
from maas_services.gateway.batches.records import open_records
from maas_services.gateway.batches.upload import Uploads


@dataclass
class BatchService:
    files: FileStore
    batches: BatchStore
    uploads: Uploads
    engine: AsyncEngine

    @classmethod
    async def open(
        cls, database_url: str, files_dir: str, limits: FileLimits, read_timeout: float
    ) -> "BatchService":
        engine = await open_records(database_url)
        blobs = DirectoryBlobStore(Path(files_dir))
        files = FileStore(engine, blobs, limits)
        return cls(files, BatchStore(engine, blobs), Uploads(files, read_timeout), engine)

    @classmethod
    async def from_settings(cls, settings) -> "BatchService":
        return await cls.open(
            settings.batches_database_url or settings.responses_database_url,
            settings.files_dir,
            FileLimits.from_settings(settings),
            settings.body_timeout_seconds,
        )

    async def close(self) -> None:
        await self.engine.dispose()
