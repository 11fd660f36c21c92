"""UForm for Mojo: the engine's C interface (`include/uform.h`) loaded at run time."""

from .library import Library, Status, Error
from .executor import Executor, ExecutorKind, Mood, RamOptions
from .arena import Arena, View, ScalarKind
from .tape import TapeView
from .progress import Progress, Continuation
from .model import Model, ModelOn, ModelDeferredOn, Deferred, Encoded, EncodeConfig, Outputs
from ._c import EncodeStats
