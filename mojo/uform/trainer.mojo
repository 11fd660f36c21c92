"""The mesh (`uform_mesh_t`) and the trainer (`uform_trainer_t`): its config, the executor receivers
`trainer.on(executor)` and `trainer.deferred(executor)`, their `step` and `save`, and `TrainerDeferred`."""

from std.ffi import c_char, c_size_t
from std.memory import OwnedPointer

from ._c import *
from ._c import _raw, _field
from .library import Library, Status, Error, _static
from .executor import Executor
from .tape import TapeView
from .progress import Progress
from .model import _c_path


@fieldwise_init
struct Modality(Equatable, TrivialRegisterPassable):
    """`uform_modality_t`: what a training item's bytes are."""

    var code: Int32
    comptime TEXT = Self(0)
    comptime IMAGE = Self(1)  # an encoded image
    comptime VIDEO = Self(2)  # an encoded clip
    comptime AUDIO = Self(3)  # an encoded sound

    def tower(self) -> UInt32:
        """Its bit in `TrainerConfig.towers` (`1 << uform_modality_t`)."""
        return UInt32(1) << UInt32(self.code)


@fieldwise_init
struct MeshCollectives(Equatable, TrivialRegisterPassable):
    """`uform_mesh_collectives_t`: how a mesh's processes reduce and gather."""

    var code: Int32
    comptime HOST = Self(0)  # RAM executors: MPI on host memory
    comptime NCCL = Self(1)  # VRAM executors: NCCL on device memory
    comptime STAGED = Self(2)  # VRAM executors: device to pinned host memory, MPI, and back


@fieldwise_init
struct MeshInfo(ImplicitlyCopyable):
    """`uform_mesh_info_t` (`Mesh.info`): the ranks, the collectives, the CUDA device this process's VRAM
    trainer steps on (-1 on RAM), whether processes share a device, whether the mesh is still usable, its
    timeout (VRAM meshes; 0 on RAM) and, once unusable, why (the engine's static text)."""

    var rank: Int
    var size: Int
    var local_rank: Int
    var local_size: Int
    var collectives: MeshCollectives
    var device: Int
    var shared_device: Bool
    var usable: Bool
    var timeout_seconds: Float64
    var broken: Optional[StaticString]


struct MeshOptions(ImplicitlyCopyable):
    """`uform_mesh_options_t`: `communicator`, the address of an `MPI_Comm` of the application's (which
    must have initialized MPI at `MPI_THREAD_SERIALIZED` or above) whose processes form the mesh; `None`
    joins `MPI_COMM_WORLD`. The address is read during `Mesh.bootstrap` only. `timeout_seconds`: how long a
    collective of a mesh over VRAM executors may take before the step raises `Status.DEVICE` and the mesh
    is unusable (0 takes 300)."""

    var communicator: RawOpt
    var timeout_seconds: Float64

    def __init__(out self, *, communicator: RawOpt = None, timeout_seconds: Float64 = 0):
        self.communicator = communicator
        self.timeout_seconds = timeout_seconds

    def _c(self) -> CMeshOptions:
        return CMeshOptions(self.communicator, self.timeout_seconds)


struct Mesh(Movable):
    """The processes of one run (`uform_mesh_t`). Freed by its destructor."""

    var _handle: RawOpt
    var library: Library

    def __init__(out self, *, _handle: RawOpt, library: Library):
        self._handle = _handle
        self.library = library

    @staticmethod
    def bootstrap(executor: Executor, options: MeshOptions = MeshOptions()) raises Error -> Self:
        """Joins this process to its run (`uform_mesh_bootstrap`), blocking on `executor`. Raises the
        engine's status: `Status.UNSUPPORTED` in this build."""
        var library = executor.library
        var c_options = options._c()
        var handle: RawOpt = None
        var args = CMeshBootstrapArgs(executor._handle, _field(Pointer(to=c_options)), _field(Pointer(to=handle)), None)
        var status = library._symbols[].mesh_bootstrap(_raw(Pointer(to=args)))
        _ = c_options^  # read through an untracked field: alive until the call returned
        library._check(status)
        return Self(_handle=handle, library=library)

    @staticmethod
    def single(library: Library) -> Self:
        """One process alone: C's NULL mesh, of rank 0 and size 1 (what a config without a mesh means)."""
        return Self(_handle=None, library=library)

    def rank(self) -> Int:
        """This process's rank (`uform_mesh_rank`)."""
        return Int(self.library._symbols[].mesh_rank(self._handle))

    def size(self) -> Int:
        """The processes in the run (`uform_mesh_size`)."""
        return Int(self.library._symbols[].mesh_size(self._handle))

    def info(self) raises Error -> MeshInfo:
        """What the mesh is (`uform_mesh_info`); never blocks."""
        var c = CMeshInfo(0, 0, 0, 0, 0, 0, False, False, 0, None)
        self.library._check(self.library._symbols[].mesh_info(self._handle, _raw(Pointer(to=c))))
        var broken = Optional[StaticString](None)
        if c.broken:
            var text = c.broken.value().unsafe_bitcast[c_char]().unsafe_mut_cast[False]()
            broken = _static(text.unsafe_origin_cast[ImmStaticOrigin]())
        return MeshInfo(Int(c.rank), Int(c.size), Int(c.local_rank), Int(c.local_size), MeshCollectives(c.collectives),
                        Int(c.device), c.shared_device, c.usable, c.timeout_seconds, broken)

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (`_ = library^` marks the end).
        var library = self.library
        library._symbols[].mesh_free(self._handle)
        _ = library^


# `Origin[mut=mut]` with `mut` inferred (`//`): `TrainerConfig[origin_of(mesh)]` names a mutable variable's
# origin, so `config.mesh = Pointer(to=mesh)` needs one implicit conversion only (to `Optional`). The default,
# the static origin, is for configs with no mesh.
struct TrainerConfig[mut: Bool, //, origin: Origin[mut=mut] = ImmStaticOrigin](Copyable):
    """`uform_trainer_config_t`, field for field, with the defaults `uform_trainer_config_default` writes.
    `resume_path` empty is NULL; `mesh` `None` is one process. Sizes of 0 take the defaults."""

    var depth: Int
    var hidden: Int
    var dims: Int
    var towers: UInt32  # bits `Modality.tower()`
    var context: Int
    var image_size: Int
    var image_patch: Int
    var video_frames: Int
    var audio_rate: Int
    var audio_mels: Int
    var audio_seconds: Float64
    var learning_rate: Float64
    var weight_decay: Float64
    var beta1: Float64
    var beta2: Float64
    var epsilon: Float64
    var clip_norm: Float64
    var lm_weight: Float64
    var warmup_steps: Int
    var total_steps: Int
    var seed: UInt64
    var resume_path: String
    var mesh: Optional[Pointer[Mesh, Self.origin]]

    def __init__(out self) raises Error:
        """The defaults of the engine `Library()` opens."""
        self = Self(Library())

    def __init__(out self, library: Library):
        """The defaults of `library` (`uform_trainer_config_default`)."""
        var c = CTrainerConfig.zero()
        library._symbols[].trainer_config_default(_raw(Pointer(to=c)))
        self.depth = Int(c.depth)
        self.hidden = Int(c.hidden)
        self.dims = Int(c.dims)
        self.towers = c.towers
        self.context = Int(c.context)
        self.image_size = Int(c.image_size)
        self.image_patch = Int(c.image_patch)
        self.video_frames = Int(c.video_frames)
        self.audio_rate = Int(c.audio_rate)
        self.audio_mels = Int(c.audio_mels)
        self.audio_seconds = c.audio_seconds
        self.learning_rate = c.learning_rate
        self.weight_decay = c.weight_decay
        self.beta1 = c.beta1
        self.beta2 = c.beta2
        self.epsilon = c.epsilon
        self.clip_norm = c.clip_norm
        self.lm_weight = c.lm_weight
        self.warmup_steps = Int(c.warmup_steps)
        self.total_steps = Int(c.total_steps)
        self.seed = c.seed
        self.resume_path = String()
        self.mesh = None

    def _c(self, ref path: List[UInt8], library: Library, entry: StaticString) raises Error -> CTrainerConfig:
        """The C structure; `path` holds the NUL-terminated resume path and must outlive the call."""
        var sizes: List[Int] = [self.depth, self.hidden, self.dims, self.context, self.image_size, self.image_patch,
                                self.video_frames, self.audio_rate, self.audio_mels, self.warmup_steps,
                                self.total_steps]
        for size in sizes:
            if size < 0:
                raise Error(Status.INVALID_ARGUMENT, entry, "a size or step count is negative", library)
        var mesh: RawOpt = None
        if self.mesh:
            mesh = self.mesh.value()[]._handle
        var resume: RawOpt = None
        if self.resume_path:
            resume = _field(path.unsafe_ptr())
        return CTrainerConfig(
            c_size_t(self.depth), c_size_t(self.hidden), c_size_t(self.dims), self.towers, c_size_t(self.context),
            c_size_t(self.image_size), c_size_t(self.image_patch), c_size_t(self.video_frames),
            c_size_t(self.audio_rate), c_size_t(self.audio_mels), self.audio_seconds, self.learning_rate,
            self.weight_decay, self.beta1, self.beta2, self.epsilon, self.clip_norm, self.lm_weight,
            c_size_t(self.warmup_steps), c_size_t(self.total_steps), self.seed, resume, mesh)


# The contract's names for the config of each constructor: one structure serves both.
comptime TrainerInitVramConfig = TrainerConfig
comptime TrainerInitRamConfig = TrainerConfig


@fieldwise_init
struct TrainerStepStats(_TrainerProduct, Defaultable, ImplicitlyCopyable, Writable):
    """`uform_trainer_step_stats_t`: what a step reports, written when it is final."""

    var loss: Float64
    var contrastive_loss: Float64
    var lm_loss: Float64
    var learning_rate: Float64
    var step: c_size_t

    def __init__(out self):
        self = Self(0, 0, 0, 0, 0)

    @staticmethod
    def _read(box: _TrainerBox) -> Self:
        return box.stats

    def write_to(self, mut writer: Some[Writer]):
        writer.write("step ", self.step, ": loss ", self.loss, " (contrastive ", self.contrastive_loss, ", lm ",
                     self.lm_loss, "), learning rate ", self.learning_rate)


struct TrainerStepConfig[origin: ImmOrigin = ImmStaticOrigin](ImplicitlyCopyable):
    """A step's related pairs, `relations[2 r]` with `relations[2 r + 1]`, and its progress, in phases of
    the step. The relations are borrowed (their origin is in the type); the progress state must outlive
    the call."""

    var relations: Span[UInt32, Self.origin]
    var progress: Progress

    def __init__(out self, *, progress: Progress = Progress()):
        self.relations = Span[UInt32, Self.origin]()
        self.progress = progress

    def __init__(out self, *, relations: Span[UInt32, Self.origin], progress: Progress = Progress()):
        self.relations = relations
        self.progress = progress


def _step_args[T: AnyType](trainer: _TrainerRef[_], executor: Executor, modalities: Span[Modality, _],
                           contents: TapeView[T, ...], config: TrainerStepConfig[_], progress: RawOpt, stats: RawOpt,
                           outcome: RawOpt) raises Error -> CTrainerStepArgs:
    """The step's arguments, after the checks C cannot make: one modality per item, whole pairs."""
    if len(modalities) != len(contents):
        raise Error(Status.INVALID_ARGUMENT, "uform_trainer_step", "modalities must hold one value per item",
                    trainer.library)
    if len(config.relations) % 2 != 0:
        raise Error(Status.INVALID_ARGUMENT, "uform_trainer_step", "relations must hold pairs", trainer.library)
    var modalities_field: RawOpt = None
    if len(modalities) > 0:
        modalities_field = _field(modalities.unsafe_ptr())
    var relations_field: RawOpt = None
    if len(config.relations) > 0:
        relations_field = _field(config.relations.unsafe_ptr())
    return CTrainerStepArgs(trainer.handle, executor._handle, modalities_field, contents._c(), relations_field,
                            c_size_t(len(config.relations) // 2), progress, stats, outcome)


@fieldwise_init
struct _TrainerRef[origin: ImmOrigin](ImplicitlyCopyable):
    """A trainer as its receivers and Deferreds see it: the handle, and the trainer's origin, which keeps
    it (and through it the mesh it runs over) alive as long as they live."""

    var handle: RawOpt
    var library: Library
    var _keep: Pointer[NoneType, Self.origin]


# The mesh's origin is a parameter: C keeps the config's mesh pointer for the trainer's whole life, so the
# trainer must keep that mesh alive (Mojo ends a value after its last use otherwise).
struct Trainer[mut: Bool, //, mesh_origin: Origin[mut=mut] = ImmStaticOrigin](Movable):
    """Owns a model in training and its optimizer state, on the executor it was made on. Its verbs run
    only there: `trainer.on(executor)` blocks, `trainer.deferred(executor)` answers a `TrainerDeferred`.
    Keeps the config's mesh alive. Freed by its destructor (`uform_trainer_free`)."""

    var _handle: RawOpt
    var library: Library
    var _mesh: Optional[Pointer[Mesh, Self.mesh_origin]]

    def __init__(out self, *, _handle: RawOpt, library: Library, mesh: Optional[Pointer[Mesh, Self.mesh_origin]]):
        self._handle = _handle
        self.library = library
        self._mesh = mesh

    # Generic over the config's origin, so `Trainer.init_ram(executor, config)` answers `Trainer[that origin]`.
    @staticmethod
    def init_ram[m: Bool, //, o: Origin[mut=m]](executor: Executor, config: TrainerConfig[o]) raises Error -> Trainer[o]:
        """A trainer on a host executor (`uform_trainer_init_ram`), from scratch or from `resume_path`."""
        return Trainer[o]._init[False](executor, config)

    @staticmethod
    def init_vram[m: Bool, //, o: Origin[mut=m]](executor: Executor, config: TrainerConfig[o]) raises Error -> Trainer[o]:
        """A trainer on a VRAM executor (`uform_trainer_init_vram`): its steps on the executor's first device;
        `Status.INVALID_ARGUMENT` for a host executor."""
        return Trainer[o]._init[True](executor, config)

    @staticmethod
    def _init[vram: Bool](executor: Executor, config: TrainerConfig[Self.mesh_origin]) raises Error -> Self:
        var library = executor.library
        comptime entry: StaticString = "uform_trainer_init_vram" if vram else "uform_trainer_init_ram"
        var path = _c_path(config.resume_path)
        var c_config = config._c(path, library, entry)
        var handle: RawOpt = None
        var args = CTrainerInitArgs(executor._handle, _field(Pointer(to=c_config)), _field(Pointer(to=handle)), None)
        var status: CStatus
        comptime if vram:  # `comptime if`: one instantiation per residency
            status = library._symbols[].trainer_init_vram(_raw(Pointer(to=args)))
        else:
            status = library._symbols[].trainer_init_ram(_raw(Pointer(to=args)))
        _ = c_config^
        _ = path^  # read by the call: alive until it returned
        library._check(status)
        return Self(_handle=handle, library=library, mesh=config.mesh)

    def _ref(self) -> _TrainerRef[origin_of(self)]:
        # `Pointer.unsafe_bitcast` keeps the origin: the reference tracks this trainer without its type.
        return _TrainerRef(self._handle, self.library, Pointer(to=self).unsafe_bitcast[NoneType]())

    def on[origin: ImmOrigin](self, ref [origin] executor: Executor) -> TrainerOn[origin_of(self), origin]:
        """Verbs that block on `executor`, the one the trainer was made on."""
        return TrainerOn(self._ref(), Pointer(to=executor))

    def deferred[origin: ImmOrigin](self, ref [origin] executor: Executor) -> TrainerDeferredOn[origin_of(self), origin]:
        """Verbs submitted to `executor`, each answering a `TrainerDeferred`."""
        return TrainerDeferredOn(self._ref(), Pointer(to=executor))

    def __deinit__(deinit self):
        # The last copy of the library may be this one: it must outlive the call (`_ = library^` marks the end).
        var library = self.library
        library._symbols[].trainer_free(self._handle)
        _ = library^


@fieldwise_init
struct TrainerOn[trainer_origin: ImmOrigin, executor_origin: ImmOrigin](Copyable):
    """The trainer's verbs, blocking on its executor: `Status.CONTENDED` while another call holds it."""

    var trainer: _TrainerRef[Self.trainer_origin]
    var executor: Pointer[Executor, Self.executor_origin]

    def step[T: AnyType](self, modalities: Span[Modality, _], contents: TapeView[T, ...],
                         config: TrainerStepConfig[_] = TrainerStepConfig()) raises Error -> TrainerStepStats:
        """One optimizer step over the items (`contents`, one `Modality` each) and their related pairs.
        A failed step changes nothing."""
        var library = self.trainer.library
        var stats = TrainerStepStats()
        var c_progress = config.progress._c
        var progress: RawOpt = None
        if c_progress.handler:
            progress = _field(Pointer(to=c_progress))
        var args = _step_args(self.trainer, self.executor[], modalities, contents, config, progress,
                              _field(Pointer(to=stats)), None)
        var status = library._symbols[].trainer_step(_raw(Pointer(to=args)))
        _ = c_progress^  # read through an untracked field: alive until the call returned
        library._check(status)
        return stats

    def save(self, path: String) raises Error:
        """Writes the inference checkpoint at `path` and the optimizer state beside it."""
        var library = self.trainer.library
        var c_path = _c_path(path)
        var args = CTrainerSaveArgs(self.trainer.handle, self.executor[]._handle, _field(c_path.unsafe_ptr()), None)
        var status = library._symbols[].trainer_save(_raw(Pointer(to=args)))
        _ = c_path^  # read by the call: alive until it returned
        library._check(status)


struct TrainerDeferredOn[trainer_origin: ImmOrigin, executor_origin: ImmOrigin](Copyable):
    """The trainer's verbs, submitted to its executor: each answers a `TrainerDeferred` at once, with the
    same arguments as the blocking ones. A failed submission leaves the outcome final with its status,
    which `wait` raises."""

    var trainer: _TrainerRef[Self.trainer_origin]
    var executor: Pointer[Executor, Self.executor_origin]

    def __init__(out self, trainer: _TrainerRef[Self.trainer_origin], executor: Pointer[Executor, Self.executor_origin]):
        self.trainer = trainer
        self.executor = executor

    def _box(self, progress: CProgress, var path: List[UInt8]) -> OwnedPointer[_TrainerBox]:
        # std.memory `OwnedPointer`: the outcome stays at one heap address while the Deferred moves.
        var box = OwnedPointer(_TrainerBox(progress, path^))
        self.trainer.library._symbols[].outcome_init(_raw(Pointer(to=box[].outcome)))
        return box^

    # `type_of(x)` names each argument's full type, origins included, so the TrainerDeferred keeps the
    # modalities, contents and relations alive while it lives.
    def step[T: AnyType](self, modalities: Span[Modality, _], contents: TapeView[T, ...],
                         config: TrainerStepConfig[_] = TrainerStepConfig()) raises Error
            -> TrainerDeferred[TrainerStepStats, Self.trainer_origin, Self.executor_origin,
                               _StepInputs[type_of(modalities), type_of(contents), type_of(config)]]:
        var library = self.trainer.library
        var box = self._box(config.progress._c, List[UInt8]())
        var progress: RawOpt = None
        if box[].progress.handler:
            progress = _field(Pointer(to=box[].progress))
        var args = _step_args(self.trainer, self.executor[], modalities, contents, config, progress,
                              _field(Pointer(to=box[].stats)), _field(Pointer(to=box[].outcome)))
        _ = library._symbols[].trainer_step(_raw(Pointer(to=args)))
        return TrainerDeferred[TrainerStepStats](box^, library, self.trainer, self.executor,
                                                 _StepInputs(modalities, contents, config))

    def save(self, path: String) raises Error
            -> TrainerDeferred[Saved, Self.trainer_origin, Self.executor_origin, _NoInputs]:
        """Submits the save; the Deferred owns the path until the call is final."""
        var library = self.trainer.library
        var box = self._box(CProgress(None, None, 0), _c_path(path))
        var args = CTrainerSaveArgs(self.trainer.handle, self.executor[]._handle, _field(box[].path.unsafe_ptr()),
                                    _field(Pointer(to=box[].outcome)))
        _ = library._symbols[].trainer_save(_raw(Pointer(to=args)))
        return TrainerDeferred[Saved](box^, library, self.trainer, self.executor, _NoInputs())


struct _TrainerBox(Movable):
    """A deferred trainer call's outcome (64-byte aligned), progress, stats slot and path, at stable heap
    addresses while it is pending."""

    var outcome: COutcome
    var progress: CProgress
    var stats: TrainerStepStats
    var path: List[UInt8]

    def __init__(out self, progress: CProgress, var path: List[UInt8]):
        self.outcome = COutcome()
        self.progress = progress
        self.stats = TrainerStepStats()
        self.path = path^


trait _TrainerProduct(ImplicitlyCopyable):
    """What a final deferred trainer call answers (`TrainerDeferred.wait`), read from its box."""

    @staticmethod
    def _read(box: _TrainerBox) -> Self:
        ...


@fieldwise_init
struct Saved(_TrainerProduct, ImplicitlyCopyable):
    """What a deferred `save` answers: the checkpoint and the optimizer state are written."""

    @staticmethod
    def _read(box: _TrainerBox) -> Self:
        return Self()


@fieldwise_init
struct _NoInputs(ImplicitlyCopyable):
    """A save borrows no input: its Deferred owns the path."""

    pass


@fieldwise_init
struct _StepInputs[M: ImplicitlyCopyable & Deinitable, C: ImplicitlyCopyable & Deinitable,
                   R: ImplicitlyCopyable & Deinitable](ImplicitlyCopyable):
    """The inputs a deferred `step` borrows: modalities, contents and the config's relations."""

    var modalities: Self.M
    var contents: Self.C
    var config: Self.R


struct TrainerDeferred[R: _TrainerProduct & Deinitable, trainer_origin: ImmOrigin, executor_origin: ImmOrigin,
                       Inputs: ImplicitlyCopyable & Deinitable](Movable):
    """A submitted trainer call answering `R` (`TrainerStepStats` through `wait`, or `Saved`). Owns its
    outcome, stats slot and path until final; borrows the trainer, the executor and the inputs, which
    Mojo keeps alive for as long as it lives. Destroying an unfinished one waits for it."""

    var _box: OwnedPointer[_TrainerBox]
    var _library: Library
    var _trainer: _TrainerRef[Self.trainer_origin]
    var _executor: Pointer[Executor, Self.executor_origin]
    var _inputs: Self.Inputs

    def __init__(out self, var box: OwnedPointer[_TrainerBox], library: Library,
                 trainer: _TrainerRef[Self.trainer_origin], executor: Pointer[Executor, Self.executor_origin],
                 inputs: Self.Inputs):
        self._box = box^
        self._library = library
        self._trainer = trainer
        self._executor = executor
        self._inputs = inputs

    def status(self) -> Status:
        """The status word, read without blocking: `Status.PENDING` or the final status."""
        return Status(self._library._symbols[].outcome_status(_raw(Pointer(to=self._box[].outcome))))

    def wait(self) raises Error -> Self.R:
        """Blocks until final (`uform_outcome_wait`), then answers the product or raises the failure, as
        many times as it is asked."""
        var symbols = self._library._symbols
        var status = symbols[].outcome_wait(_raw(Pointer(to=self._box[].outcome)))
        if status != 0:
            raise Error(symbols[].outcome_error(_raw(Pointer(to=self._box[].outcome))), self._library)
        return Self.R._read(self._box[])

    def __deinit__(deinit self):
        var library = self._library
        library._symbols[].outcome_destroy(_raw(Pointer(to=self._box[].outcome)))
        _ = library^
