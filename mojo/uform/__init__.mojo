"""UForm for Mojo: the engine's C interface (`include/uform.h`) loaded at run time."""

from .library import Library, Status, Error, Feature, Weights
from .executor import Executor, ExecutorKind, Mood, RamOptions, VramOptions, ThreadPool, PoolWork
from .arena import Arena, View, ScalarKind
from .tape import TapeView
from .progress import Progress, Continuation
from .model import (
    Model, ModelVerbs, ModelOn, ModelDeferredOn, Deferred, DeferredLoad, Encoded, EncodeConfig, LoadConfig, Outputs,
    Source,
)
from ._c import EncodeStats, TokenizeStats, TokenizerInfo, ModelInfo, TransformerInfo, TextInfo, ImageInfo, VideoInfo, AudioInfo
from .trainer import (
    Modality, Mesh, MeshCollectives, MeshInfo, MeshOptions, Trainer, TrainerConfig, TrainerInitRamConfig,
    TrainerInitVramConfig, TrainerOn, TrainerDeferredOn, TrainerDeferred, TrainerStepConfig, TrainerStepStats, Saved,
)
from .tokenizer import (
    Tokenizer, TokenizerVerbs, TokenizerOn, TokenizerDeferredOn, TokenizerDeferred, Tokenized, TokenizeConfig,
)
