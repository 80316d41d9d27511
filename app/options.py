"""Command-line flags shared by every command, with llama.cpp's names.

Each speculator type's own flags come from its descriptor (its parameters,
declared once); a flag's value is read by its kind
(:data:`speculators.param_kinds.KINDS`), as a settings field's is.

Flags default to None so that a value given on the command line can win
over ``config.toml`` while unset flags leave the config alone.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.descriptor import descriptors, find
from speculators.param_kinds import FLOAT, INT, KINDS, NGL, Kind
from speculators.types import ALL_TYPES, LiveMapping, all_types_str, parse_types


def _flag_reader(kind: Kind) -> Callable[[str], Any] | None:
    """argparse's ``type`` for a flag of ``kind`` (None: the value as given); a value the kind
    cannot read is refused with what was expected and what was given."""
    if not kind.reads_flag:
        return None

    def read(v: str) -> Any:
        try:
            return kind.from_flag(v)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{e}, got {v!r}") from None
    read.__name__ = kind.name
    return read


_int = _flag_reader(INT)
_float = _flag_reader(FLOAT)
_ngl = _flag_reader(NGL)


def _floats(v: str) -> list[float]:
    try:
        return [float(x) for x in v.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {v!r}") from None


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("-m", "--model", help="GGUF model file (default: the embedded Gemma 3 270M)")
    g.add_argument("-c", "--ctx-size", type=_int, dest="ctx_size", help="context size in tokens (default 4096)")
    g.add_argument("-t", "--threads", type=_int, help="CPU threads (default: physical cores)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=_ngl, dest="n_gpu_layers",
                   help="layers to offload to the GPU: a number, 'auto' or 'all'")
    from .cpu_check import MODES
    g.add_argument("--extra-bufts", choices=MODES, dest="extra_bufts",
                   help="the CPU's extra buffer types (AMX, repacked weights): auto (default: as a one-time "
                        "probe found on this CPU: all of them where they work, else the repacked weights "
                        "alone where those do, else none), on, repack, or off")
    g.add_argument("-nr", "--no-repack", action="store_const", const="off", dest="extra_bufts",
                   help="llama.cpp's flag: the same as --extra-bufts off")
    d = p.add_argument_group("devices and other machines (llama.cpp's flags)")
    d.add_argument("--rpc", dest="rpc", metavar="SERVERS",
                   help="comma-separated RPC servers (HOST:PORT) whose devices join this machine's: start "
                        "`draftlight rpc-server` on each helper machine; with -ngl the layers spread over "
                        "every device (a trusted network only: the protocol has no authentication)")
    d.add_argument("-dev", "--device", dest="device", metavar="DEV1,DEV2",
                   help="devices for the model's offloaded layers, as `draftlight doctor` lists them "
                        "(RPC0, CUDA0, ...; none = the CPU only; default: all)")
    d.add_argument("-sm", "--split-mode", dest="split_mode", choices=("none", "layer", "row", "tensor"),
                   help="how to split the model across devices (default: layer)")
    d.add_argument("-ts", "--tensor-split", dest="tensor_split", metavar="N0,N1,...",
                   help="the share of the offloaded layers per device, in --device order, e.g. 3,1 "
                        "(default: by free memory)")
    d.add_argument("-mg", "--main-gpu", dest="main_gpu", type=_int, metavar="INDEX",
                   help="the device used with --split-mode none (default 0)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temp", "--temperature", type=_float, dest="temp", help="temperature (0 = greedy; default 0.8)")
    g.add_argument("--top-k", type=_int, dest="top_k", help="top-k (default 40, 0 = off)")
    g.add_argument("--top-p", type=_float, dest="top_p", help="top-p (default 0.95)")
    g.add_argument("--min-p", type=_float, dest="min_p", help="min-p (default 0.2; llama.cpp's is 0.05)")
    g.add_argument("-s", "--seed", type=_int, help="RNG seed (default: random)")


def _on_off(v: str) -> bool:
    v = v.strip().lower()
    if v in ("on", "true", "yes", "1"):
        return True
    if v in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {v!r}")


def add_spec_args(p: argparse.ArgumentParser, repeatable: bool = False) -> None:
    """The speculation flags; ``repeatable``: ``--spec-type`` may be given several times (bench rows)."""
    g = p.add_argument_group("speculative decoding (llama.cpp's flags)")
    if repeatable:
        g.add_argument("--spec-type", dest="spec_type", metavar="LIST", action="append",
                       help=f"speculative types to compare with none, one row per flag: {all_types_str()} "
                            f"(repeatable; one comma list also gets a row per type; default: auto)")
    else:
        g.add_argument("--spec-type", dest="spec_type", metavar="LIST",
                       help=f"comma-separated speculative types: {all_types_str()} (default: the "
                            f"configured ones, else auto: the types this model can use, drafting only "
                            f"where it pays)")
    g.add_argument("--spec-adaptive", dest="spec_adaptive", type=_on_off, metavar="on|off",
                   help="the adaptive controller: before each step decide whether to draft and how long, "
                        "from the measured verify cost and each drafter's acceptance (default: on with "
                        "auto, off with a list of types, as llama.cpp)")
    # each type's own flags (its descriptor's), in llama.cpp's enum order (the draft-model flags first)
    for t in ALL_TYPES:
        d = find(t)
        for flag in (d.flags if d is not None else ()):
            g.add_argument(*flag.names, type=_flag_reader(KINDS[flag.kind]), dest=flag.dest,
                           metavar=flag.metavar, help=flag.help)
    g.add_argument("--spec-synth-len", type=_float, dest="spec_synth_len", metavar="L",
                   help="synthetic mean acceptance length (benchmarking only)")
    g.add_argument("--spec-synth-rates", type=_floats, dest="spec_synth_rates", metavar="P0,P1,...",
                   help="synthetic per-position acceptance rates (benchmarking only)")


def spec_flag_map() -> dict[str, tuple[str, str]]:
    """The spec flags' ``dest`` -> (SpecParams section, field), from every type's descriptor."""
    out: dict[str, tuple[str, str]] = {}
    for d in descriptors():
        for flag in d.flags:
            section, name = flag.target.split(".", 1)
            out[flag.dest] = (section, name)
    return out


#: the same, as a live view (a type declared later shows in it)
_SPEC_FLAG_MAP = LiveMapping(spec_flag_map)


def spec_from_args(args: argparse.Namespace, base: SpecParams | None = None) -> SpecParams:
    """Apply the spec flags that were given on top of ``base``; validate."""
    p = (base or SpecParams()).copy()
    spec_type = getattr(args, "spec_type", None)
    if isinstance(spec_type, list):
        spec_type = ",".join(spec_type)
    if spec_type is not None:
        p.types = parse_types(spec_type)
    if getattr(args, "spec_adaptive", None) is not None:
        p.adaptive = args.spec_adaptive
    for flag, (section, name) in _SPEC_FLAG_MAP.items():
        v = getattr(args, flag, None)
        if v is not None:
            setattr(getattr(p, section), name, v)
    if getattr(args, "spec_synth_len", None) is not None:
        p.synth_len = args.spec_synth_len
    if getattr(args, "spec_synth_rates", None) is not None:
        p.synth_rates = list(args.spec_synth_rates)
    p.validate()
    return p


def spec_types_configured(config_path=None) -> bool:
    """Whether ``config.toml`` names the speculative types (``[speculation] types``).

    ``generate`` and ``bench`` use ``auto`` when neither a flag nor the file names
    them. A file that cannot be read counts as not naming them (the caller's
    own config loading reports it).
    """
    import sys
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    from . import paths
    path = config_path or paths.config_file()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    spec = data.get("speculation")
    return isinstance(spec, dict) and "types" in spec


def default_spec(args: argparse.Namespace, configured: SpecParams, from_file: bool) -> SpecParams:
    """The flags over the configured speculation; ``auto`` where nothing names the types.

    ``from_file``: the configured params come from a config file that names
    its types (an explicit ``types = []`` there means none, as before).
    """
    base = configured
    if getattr(args, "spec_type", None) is None and not base.types and not from_file:
        base = configured.copy()
        base.types = parse_types("auto")
    return spec_from_args(args, base)


def sampling_from_args(args: argparse.Namespace, base: SamplingParams | None = None) -> SamplingParams:
    s = SamplingParams(**(base.__dict__ if base else {}))
    for flag, name in (("temp", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                       ("min_p", "min_p"), ("seed", "seed")):
        v = getattr(args, flag, None)
        if v is not None:
            setattr(s, name, v)
    s.validate()
    return s


@dataclass
class ModelOptions:
    model: str | None = None
    ctx_size: int = 4096
    threads: int | None = None
    n_gpu_layers: int | None = None
    #: the CPU's extra buffer types: "auto" (as probed), "on" or "off" (see app.cpu_check)
    extra_bufts: str = "auto"
    #: RPC servers (``host:port,...``) whose devices join this machine's (llama.cpp's ``--rpc``)
    rpc: str | None = None
    #: ``--device``, ``--split-mode``, ``--tensor-split``, ``--main-gpu`` (see speculators.devices)
    device: str | None = None
    split_mode: str | None = None
    tensor_split: str | None = None
    main_gpu: int | None = None
    extra: dict = field(default_factory=dict)


def model_options_from_args(args: argparse.Namespace, base: ModelOptions | None = None) -> ModelOptions:
    m = ModelOptions(**(base.__dict__ if base else {}))
    for name in PLACEMENT_KEYS:
        v = getattr(args, name, None)
        if v is not None:
            setattr(m, name, v)
    from speculators.params import ParamError
    if m.ctx_size is not None and m.ctx_size < 0:
        raise ParamError("ctx_size", "must be >= 0")
    check_placement(m)
    return m


#: the model options that flags, config.toml and the settings pane share
PLACEMENT_KEYS = ("model", "ctx_size", "threads", "n_gpu_layers", "extra_bufts", "rpc", "device", "split_mode",
                  "tensor_split", "main_gpu")


def check_placement(m: ModelOptions) -> None:
    """Refuse malformed ``--rpc``, ``--split-mode`` and ``--tensor-split`` values before any load.

    >>> check_placement(ModelOptions(rpc="localhost"))
    Traceback (most recent call last):
    ...
    speculators.params.ParamError: rpc: invalid RPC server 'localhost': expected HOST:PORT, e.g. 192.168.1.20:50052
    """
    from speculators import devices as dv
    from speculators.params import ParamError
    for name, check in (("rpc", dv.parse_endpoints), ("split_mode", dv.parse_split_mode),
                        ("tensor_split", dv.parse_tensor_split)):
        v = getattr(m, name)
        if v is not None:
            try:
                check(v)
            except dv.DeviceError as e:
                raise ParamError(name, str(e)) from None
