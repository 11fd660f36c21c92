"""The C structures of `include/uform.h`, mirrored field for field, and the signatures of the bound
entry points. `mojo/layout.mojo` prints every size and offset here, and `mojo/lockstep.py`
compares them with what the C compiler reports."""

from std.ffi import c_int, c_size_t, c_char

# `void *` and friends. Every handle and every pointer argument crosses as an untracked opaque pointer:
# one ABI for all of them (std.memory `OpaquePointer`, `MutUntrackedOrigin` from the prelude).
# An address passed for the duration of one call is any-origin: an untracked one lets Mojo end the
# pointee's lifetime (and drop its stores) before the call reads it, as the compiler showed.
comptime Raw = OpaquePointer[MutAnyOrigin]
# A nullable `void *` in a structure or a handle: `Optional[Pointer]` is laid out as one nullable pointer
# (layout.mojo checks it); fields cannot hold any-origin pointers, so these are untracked.
comptime RawOpt = Optional[OpaquePointer[MutUntrackedOrigin]]
comptime CString = Pointer[c_char, ImmStaticOrigin]
comptime CStatus = Int32


def _field[T: AnyType](p: Pointer[T, _]) -> RawOpt:
    """An address stored in a C structure field (untracked: the caller keeps the pointee alive)."""
    return p.unsafe_bitcast[NoneType]().unsafe_mut_cast[True]().unsafe_origin_cast[MutUntrackedOrigin]()


def _raw[T: AnyType](p: Pointer[T, _]) -> Raw:
    """An address as a `void *` for one C call (std.memory `Pointer.unsafe_bitcast`, `unsafe_mut_cast`,
    `unsafe_origin_cast`). Take it with `Pointer(to=x)` at the call site: a helper taking `ref x` may see
    a temporary copy of a register-passable value, whose address dies with the helper."""
    return p.unsafe_bitcast[NoneType]().unsafe_mut_cast[True]().unsafe_origin_cast[MutAnyOrigin]()


# `UFORM_ERROR_MESSAGE_SIZE`: the bytes a failure's message holds at most, its NUL included.
comptime ERROR_MESSAGE_SIZE = 160


@fieldwise_init
struct CError(ImplicitlyCopyable):
    """`uform_error_t`."""
    var status: CStatus
    var entry: CString
    var message: CString


@fieldwise_init
struct CProgress(ImplicitlyCopyable):
    """`uform_progress_t`: the handler crosses as a nullable `void *` holding a `thin abi("C")` pointer."""
    var handler: RawOpt
    var state: RawOpt
    var steps: c_size_t


@fieldwise_init
struct CRamOptions(ImplicitlyCopyable):
    """`uform_ram_options_t`."""
    var domains: RawOpt
    var domains_count: c_size_t
    var threads: c_size_t
    var spin_ns: UInt64
    var pin: Bool


@fieldwise_init
struct CExecutorInfo(ImplicitlyCopyable):
    """`uform_executor_info_t`."""
    var kind: Int32
    var threads: c_size_t
    var domains_count: c_size_t
    var uring: Bool


@fieldwise_init
struct CExecutorNopArgs(ImplicitlyCopyable):
    """`uform_executor_nop_args_t`."""
    var executor: RawOpt
    var delay_ns: UInt64
    var outcome: RawOpt


@fieldwise_init
struct CView(ImplicitlyCopyable):
    """`uform_view_t`."""
    var data: RawOpt
    var scales: RawOpt
    var item_offsets: RawOpt
    var rows: c_size_t
    var columns: c_size_t
    var items: c_size_t
    var row_stride: c_size_t
    var scalar: Int32
    var device: Bool
    var arena: RawOpt
    var generation: UInt64

    @staticmethod
    def empty() -> Self:
        return Self(None, None, None, 0, 0, 0, 0, 0, False, None, 0)


@fieldwise_init
struct CTape(ImplicitlyCopyable):
    """`uform_tape_t`."""
    var data: RawOpt
    var offsets: RawOpt
    var count: c_size_t
    var length: c_size_t


@fieldwise_init
struct CLoadConfig(ImplicitlyCopyable):
    """`uform_load_config_t`."""
    var progress: CProgress
    var map: Bool
    var weights: Int32  # uform_weights_t


@fieldwise_init
struct CModelLoadArgs(ImplicitlyCopyable):
    """`uform_model_load_args_t`."""
    var executor: RawOpt
    var path: RawOpt
    var config: RawOpt
    var model: RawOpt
    var outcome: RawOpt


@fieldwise_init
struct EncodeStats(ImplicitlyCopyable, Defaultable):
    """`uform_encode_stats_t`: what an encode reports, written when the call is final."""
    var items: c_size_t
    var failed: c_size_t
    var bytes: c_size_t
    var truncated: c_size_t
    var read_ns: UInt64
    var decode_ns: UInt64
    var compute_ns: UInt64
    var convert_ns: UInt64
    var total_ns: UInt64

    def __init__(out self):
        self = Self(0, 0, 0, 0, 0, 0, 0, 0, 0)


@fieldwise_init
struct CEncodeConfig(ImplicitlyCopyable):
    """`uform_encode_config_t`."""
    var outputs_scalar: Int32
    var matryoshka: c_size_t
    var progress: CProgress
    var stats: RawOpt
    var normalize: Bool  # unit vectors even where the family gives them unnormalized
    var prompt: RawOpt  # a model that reads tokens: a prompt before each text (NUL-terminated), or None
    var prompt_name: RawOpt  # or the model's prompt of that name; None for both: its default prompt


@fieldwise_init
struct CEncoded(ImplicitlyCopyable):
    """`uform_encoded_t`."""
    var embeddings: CView
    var token_vectors: CView
    var states: CView
    var statuses: RawOpt
    var items: c_size_t
    var token_spans: CView  # a model that reads tokens: each token vector's byte span, two U32 a row

    @staticmethod
    def empty() -> Self:
        return Self(CView.empty(), CView.empty(), CView.empty(), None, 0, CView.empty())


@fieldwise_init
struct CEncodeCommon(ImplicitlyCopyable):
    """`UFORM_ENCODE_COMMON`, the fields every encode's arguments begin with. Nested here, laid out as C
    lays out the macro's fields inline: 56 bytes aligned to 8, so the next field lands where C puts it
    (layout.mojo prints every offset through this nesting)."""
    var model: RawOpt
    var executor: RawOpt
    var outputs: UInt32
    var arena: RawOpt
    var config: RawOpt
    var encoded: RawOpt
    var outcome: RawOpt


@fieldwise_init
struct CTextEncodeArgs(ImplicitlyCopyable):
    """`uform_text_encode_args_t`: UFORM_ENCODE_COMMON, then the texts."""
    var common: CEncodeCommon
    var texts: CTape


@fieldwise_init
struct CMediaEncodeArgs(ImplicitlyCopyable):
    """`uform_image_encode_args_t`, `uform_video_encode_args_t` and `uform_audio_encode_args_t`, which
    share one layout: UFORM_ENCODE_COMMON, a tape of paths or encoded files, and its `uform_source_t`."""
    var common: CEncodeCommon
    var media: CTape
    var source: Int32


@fieldwise_init
struct CImageEncodePixelsArgs(ImplicitlyCopyable):
    """`uform_image_encode_pixels_args_t`."""
    var common: CEncodeCommon
    var pixels: CTape
    var heights: RawOpt
    var widths: RawOpt


@fieldwise_init
struct CAudioEncodeSamplesArgs(ImplicitlyCopyable):
    """`uform_audio_encode_samples_args_t`."""
    var common: CEncodeCommon
    var samples: CTape
    var rate: c_size_t


@fieldwise_init
struct CTextChooseArgs(ImplicitlyCopyable):
    """`uform_text_choose_args_t`."""
    var model: RawOpt
    var executor: RawOpt
    var states: RawOpt
    var choices: CTape
    var arena: RawOpt
    var progress: RawOpt
    var probabilities: RawOpt
    var outcome: RawOpt


@fieldwise_init
struct CVramOptions(ImplicitlyCopyable):
    """`uform_vram_options_t`."""
    var devices: RawOpt
    var devices_count: c_size_t


@fieldwise_init
struct CPoolVTable(ImplicitlyCopyable):
    """`uform_pool_vtable_t`: two C function pointers, each crossing as a nullable `void *`."""
    var count_threads: RawOpt
    var for_threads: RawOpt


@fieldwise_init
struct TransformerInfo(ImplicitlyCopyable, Writable):
    """`uform_transformer_info_t`."""
    var depth: c_size_t
    var hidden: c_size_t
    var heads: c_size_t
    var mlp: c_size_t
    var head: c_size_t  # each head's width: hidden / heads
    var norm: Int32  # uform_norm_t: 0 RMSNorm, 1 LayerNorm
    var norm_eps: Float32
    var post_norm: Bool
    var input_norm: Bool
    var final_norm: Bool
    var activation: Int32  # uform_activation_t: 0 tanh GELU, 1 erf GELU, 2 quick GELU
    var rotary: Bool
    var causal: Bool
    var pooling: Int32  # uform_pooling_t: 0 last, 1 first, 2 mean, 3 end of text, 4 attention head
    var projection: Bool
    var projection_bias: Bool
    var class_token: Bool
    var registers: c_size_t  # patch towers: register tokens after the class token, in no output
    var relative_buckets: c_size_t  # text towers: buckets of the bias by relative position (MPNet's 32), or 0
    var projection_tanh: Bool  # text towers: tanh after the projection (sentence-transformers' Dense module)

    @staticmethod
    def zero() -> Self:
        return Self(0, 0, 0, 0, 0, 0, 0, False, False, False, 0, False, False, 0, False, False, False, 0, 0, False)

    def write_to(self, mut writer: Some[Writer]):
        writer.write("depth ", self.depth, ", hidden ", self.hidden, ", heads ", self.heads, ", mlp ", self.mlp)


@fieldwise_init
struct TextInfo(ImplicitlyCopyable):
    """The `text` member of `uform_model_info_t`."""
    var transformer: TransformerInfo
    var context: c_size_t  # bytes, or tokens where the model reads tokens
    var vocab: c_size_t  # 0: the model reads bytes
    var positions: c_size_t
    var position_offset: c_size_t
    var token_type: Bool
    var cut_ids: Bool  # texts past the context lose their last tokens (UForm 3's processor)
    var padded: Bool  # texts padded with pad_id to the context (SigLIP)
    var pad_id: c_size_t
    var strip: Bool  # texts stripped of whitespace as Python's str.strip() (sentence-transformers)


@fieldwise_init
struct ImageInfo(Copyable):
    """The `image` member of `uform_model_info_t`."""
    var transformer: TransformerInfo
    var size: c_size_t
    var patch: c_size_t
    var mean: Array[Float32, 3]
    var std: Array[Float32, 3]
    var resize: Int32  # uform_image_resize_t
    var resample: Int32  # uform_image_resample_t


@fieldwise_init
struct VideoInfo(ImplicitlyCopyable):
    """The `video` member of `uform_model_info_t`."""
    var frames: c_size_t


@fieldwise_init
struct AudioInfo(ImplicitlyCopyable):
    """The `audio` member of `uform_model_info_t`."""
    var transformer: TransformerInfo
    var rate: c_size_t
    var mels: c_size_t
    var window: c_size_t
    var hop: c_size_t
    var patch_frames: c_size_t
    var max_patches: c_size_t
    var seconds: Float64


comptime MATRYOSHKA_MAX = 16


@fieldwise_init
struct ModelInfo(Copyable):
    """`uform_model_info_t`: the model's sizes, towers and input geometry (`Model.info`)."""
    var dims: c_size_t
    var matryoshka: Array[c_size_t, MATRYOSHKA_MAX]
    var matryoshka_count: c_size_t
    var parameters: c_size_t
    var bytes: c_size_t
    var has_text: Bool
    var has_image: Bool
    var has_video: Bool
    var has_audio: Bool
    var has_logit: Bool
    var text: TextInfo
    var image: ImageInfo
    var video: VideoInfo
    var audio: AudioInfo
    var weights: Int32  # uform_weights_t (Weights.BF16 or Weights.I8): the blocks' linear layers as they run
    var family: Array[UInt8, 16]  # NUL-terminated: "uform", "bert", "xlm-roberta", ...
    var normalized: Bool  # embeddings are unit vectors as the family's reference gives them

    def __init__(out self):
        var zero = TransformerInfo.zero()
        self = Self(0, Array[c_size_t, MATRYOSHKA_MAX](fill=0), 0, 0, 0, False, False, False, False, False,
                    TextInfo(zero, 0, 0, 0, 0, False, False, False, 0, False),
                    ImageInfo(zero, 0, 0, Array[Float32, 3](fill=0), Array[Float32, 3](fill=0), 0, 0),
                    VideoInfo(0), AudioInfo(zero, 0, 0, 0, 0, 0, 0, 0), 0, Array[UInt8, 16](fill=0), False)

    def matryoshka_widths(self) -> List[Int]:
        """The valid embedding prefixes, ascending."""
        var widths = List[Int]()
        for i in range(min(Int(self.matryoshka_count), MATRYOSHKA_MAX)):
            widths.append(Int(self.matryoshka[i]))
        return widths^


@fieldwise_init
struct CTinyCheckpointArgs(ImplicitlyCopyable):
    """`uform_tiny_checkpoint_args_t`."""
    var path: RawOpt
    var seed: UInt64
    var depth: c_size_t
    var hidden: c_size_t
    var mlp: c_size_t
    var context: c_size_t
    var image_size: c_size_t
    var image_patch: c_size_t


@fieldwise_init
struct CCheckpointQuantizeArgs(ImplicitlyCopyable):
    """`uform_checkpoint_quantize_args_t`."""
    var input: RawOpt
    var output: RawOpt


@fieldwise_init
struct CCheckpointConvertArgs(ImplicitlyCopyable):
    """`uform_checkpoint_convert_args_t`."""
    var input: RawOpt
    var output: RawOpt
    var weights: Int32  # uform_weights_t: STORED or I8


@fieldwise_init
struct TokenizerInfo(Copyable, Writable):
    """`uform_tokenizer_info_t`: the vocabulary (ids are below it), the file's truncation in tokens (0: none),
    the special tokens added to one text, and the model's kind (`model_name`)."""
    var vocabulary: c_size_t
    var max_length: c_size_t
    var special_added: c_size_t
    var model: Array[UInt8, 16]  # NUL-terminated: "WordPiece", "BPE", "Unigram", "WordLevel", ...

    def __init__(out self):
        self = Self(0, 0, 0, Array[UInt8, 16](fill=0))

    def model_name(self) -> String:
        var length = 0
        while length < 15 and self.model[length] != 0:
            length += 1
        return String(StringSpan(unsafe_from_utf8=Span(self.model)[:length]))

    def write_to(self, mut writer: Some[Writer]):
        writer.write(self.model_name(), ", vocabulary ", self.vocabulary, ", max_length ", self.max_length,
                     ", special_added ", self.special_added)


@fieldwise_init
struct TokenizeStats(ImplicitlyCopyable, Defaultable):
    """`uform_tokenize_stats_t`: what a tokenize call reports, written when the call is final."""
    var items: c_size_t
    var failed: c_size_t
    var bytes: c_size_t
    var tokens: c_size_t
    var truncated: c_size_t
    var total_ns: UInt64

    def __init__(out self):
        self = Self(0, 0, 0, 0, 0, 0)


@fieldwise_init
struct CTokenizeConfig(ImplicitlyCopyable):
    """`uform_tokenize_config_t`."""
    var without_special_tokens: Bool
    var progress: CProgress
    var stats: RawOpt


@fieldwise_init
struct CTokenized(ImplicitlyCopyable):
    """`uform_tokenized_t`."""
    var ids: CView
    var spans: CView
    var statuses: RawOpt
    var items: c_size_t
    var special: RawOpt  # one byte per token: 1 for the post-processor's and padding's tokens

    @staticmethod
    def empty() -> Self:
        return Self(CView.empty(), CView.empty(), None, 0, None)


@fieldwise_init
struct CTextTokenizeArgs(ImplicitlyCopyable):
    """`uform_text_tokenize_args_t`."""
    var tokenizer: RawOpt
    var executor: RawOpt
    var texts: CTape
    var arena: RawOpt
    var config: RawOpt
    var tokenized: RawOpt
    var outcome: RawOpt


@fieldwise_init
struct CMeshOptions(ImplicitlyCopyable):
    """`uform_mesh_options_t`: the address of the `MPI_Comm` to join, or NULL for `MPI_COMM_WORLD`, and the
    seconds a collective of a VRAM mesh may take (0: 300)."""
    var communicator: RawOpt
    var timeout_seconds: Float64


@fieldwise_init
struct CMeshBootstrapArgs(ImplicitlyCopyable):
    """`uform_mesh_bootstrap_args_t`."""
    var executor: RawOpt
    var options: RawOpt
    var mesh: RawOpt
    var outcome: RawOpt


@fieldwise_init
struct CMeshInfo(ImplicitlyCopyable):
    """`uform_mesh_info_t`: `broken` a static C string, or NULL."""
    var rank: c_size_t
    var size: c_size_t
    var local_rank: c_size_t
    var local_size: c_size_t
    var collectives: Int32
    var device: c_int
    var shared_device: Bool
    var usable: Bool
    var timeout_seconds: Float64
    var broken: RawOpt


@fieldwise_init
struct CTrainerConfig(ImplicitlyCopyable):
    """`uform_trainer_config_t`, field for field (`TrainerConfig` is its Mojo face)."""
    var depth: c_size_t
    var hidden: c_size_t
    var dims: c_size_t
    var towers: UInt32
    var context: c_size_t
    var image_size: c_size_t
    var image_patch: c_size_t
    var video_frames: c_size_t
    var audio_rate: c_size_t
    var audio_mels: c_size_t
    var audio_seconds: Float64
    var learning_rate: Float64
    var weight_decay: Float64
    var beta1: Float64
    var beta2: Float64
    var epsilon: Float64
    var clip_norm: Float64
    var lm_weight: Float64
    var warmup_steps: c_size_t
    var total_steps: c_size_t
    var seed: UInt64
    var resume_path: RawOpt
    var mesh: RawOpt

    @staticmethod
    def zero() -> Self:
        return Self(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, None, None)


@fieldwise_init
struct CTrainerInitArgs(ImplicitlyCopyable):
    """`uform_trainer_init_args_t`."""
    var executor: RawOpt
    var config: RawOpt
    var trainer: RawOpt
    var outcome: RawOpt


@fieldwise_init
struct CTrainerStepArgs(ImplicitlyCopyable):
    """`uform_trainer_step_args_t`."""
    var trainer: RawOpt
    var executor: RawOpt
    var modalities: RawOpt
    var contents: CTape
    var relations: RawOpt
    var relations_count: c_size_t
    var progress: RawOpt
    var stats: RawOpt
    var outcome: RawOpt


@fieldwise_init
struct CTrainerSaveArgs(ImplicitlyCopyable):
    """`uform_trainer_save_args_t`."""
    var trainer: RawOpt
    var executor: RawOpt
    var path: RawOpt
    var outcome: RawOpt


comptime OUTCOME_SIZE = 768
comptime OUTCOME_ALIGNMENT = 64


@align(64)
struct COutcome(Movable):
    """`uform_outcome_t`: 768 bytes aligned to 64 (std `@align`, matching C's `_Alignas`)."""
    var opaque: Array[UInt8, OUTCOME_SIZE]

    def __init__(out self):
        self.opaque = Array[UInt8, OUTCOME_SIZE](fill=0)


# The signatures of the bound entry points (`thin abi("C")` function types: the C calling convention).
comptime FnStatusName = def(CStatus) thin abi("C") -> CString
comptime FnLastError = def() thin abi("C") -> CError
comptime FnErrorRender = def(Raw, Raw, c_size_t) thin abi("C") -> c_size_t
comptime FnFeatures = def() thin abi("C") -> UInt32
comptime FnVersion = def(Raw, Raw, Raw) thin abi("C") -> NoneType
comptime FnKernels = def(Raw, Raw) thin abi("C") -> CString
comptime FnVoidOfRaw = def(Raw) thin abi("C") -> NoneType
comptime FnVoidOfRawOpt = def(RawOpt) thin abi("C") -> NoneType
comptime FnStatusOfRaw = def(Raw) thin abi("C") -> CStatus
comptime FnStatusOfRawOpt = def(RawOpt) thin abi("C") -> CStatus
comptime FnErrorOfRaw = def(Raw) thin abi("C") -> CError
comptime FnStatusOfRawRaw = def(RawOpt, Raw) thin abi("C") -> CStatus
comptime FnRawOptOfRaw = def(Raw) thin abi("C") -> RawOpt
comptime FnDrain = def(RawOpt, Int32) thin abi("C") -> CStatus
comptime FnArenaReserve = def(RawOpt, c_size_t) thin abi("C") -> CStatus
comptime FnSizeOfRawOpt = def(RawOpt) thin abi("C") -> c_size_t
comptime FnU64OfRawOpt = def(RawOpt) thin abi("C") -> UInt64
comptime FnScalarSize = def(Int32) thin abi("C") -> c_size_t
comptime FnViewRow = def(Raw, c_size_t, Raw) thin abi("C") -> CStatus
comptime FnViewCopy = def(Raw, Raw, c_size_t, RawOpt) thin abi("C") -> CStatus
comptime FnStatusOfRawRawRaw = def(Raw, RawOpt, Raw) thin abi("C") -> CStatus
comptime FnNotifyEventfd = def(Raw, c_int) thin abi("C") -> CStatus
comptime FnNotifyRing = def(Raw, c_int, UInt64) thin abi("C") -> CStatus
comptime FnTokenizerParse = def(Raw, c_size_t, Raw) thin abi("C") -> CStatus
comptime FnTokenizerToken = def(RawOpt, UInt32, Raw, Raw) thin abi("C") -> CStatus
comptime FnModelPrompt = def(RawOpt, RawOpt, Raw, c_size_t, Raw) thin abi("C") -> CStatus
comptime FnHubFolder = def(Raw, Raw, c_size_t, Raw) thin abi("C") -> CStatus
# A structure returned by value: Mojo 1.2 passes the hidden result pointer (sret) as C does (40 bytes here).
comptime FnRamOptionsDefault = def() thin abi("C") -> CRamOptions
