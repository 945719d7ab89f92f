"""State held by the Python worker: rows (`rows`), their versions (`versioned`), the file
format (`files`), the files' lifecycle (`lifecycle`), the time index (`time_index`), and the
states a worker holds between tasks under its memory budget (`held`, `budget`)."""
from .files import CorruptStateFile
from .lifecycle import FileSource, MissingStateFiles
from .time_index import TimeIndex
from .versioned import VersionedState

__all__ = ["CorruptStateFile", "FileSource", "MissingStateFiles", "TimeIndex",
           "VersionedState"]
