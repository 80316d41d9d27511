"""One descriptor per speculator type (speculators/descriptor.py): the tables derived from them.

The reference types' derived views are exactly what they were when each was
written out by hand; a toy type declared here shows up everywhere (types,
flags, Automatic, the settings pane, the themes, the chain) and nowhere once
it is withdrawn.
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import pytest

from speculators import descriptor
from speculators.auto import _NGRAM_REASONS, auto_plan
from speculators.base import DraftRequest, Speculator
from speculators.chain import SpeculatorChain, Unavailable, implemented_types
from speculators.descriptor import HIDDEN, NGRAM, Drafter, Flag, Nothing, Setting, SpecDescriptor, registered
from speculators.param_kinds import INT, Param
from speculators.params import ParamError, SpecParams
from speculators.types import (ALL_TYPES, HIDDEN_STATE_TYPES, MODEL_TYPES, NGRAM_TYPES, PRIORITY, SpecType,
                               UnknownSpecType, all_types_str, parse_types)

from .gguf_factory import write_header_only

REFERENCE_PRIORITY = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
                      "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"]

#: app.options' flag map as it was written out by hand
REFERENCE_FLAGS = {
    "spec_draft_model": ("draft", "model"),
    "spec_draft_n_max": ("draft", "n_max"),
    "spec_draft_n_min": ("draft", "n_min"),
    "spec_draft_p_min": ("draft", "p_min"),
    "spec_draft_ngl": ("draft", "n_gpu_layers"),
    "spec_draft_device": ("draft", "device"),
    "spec_draft_ctx": ("draft", "n_ctx"),
    "spec_draft_threads": ("draft", "n_threads"),
    "spec_ngram_mod_n_match": ("ngram_mod", "n_match"),
    "spec_ngram_mod_n_min": ("ngram_mod", "n_min"),
    "spec_ngram_mod_n_max": ("ngram_mod", "n_max"),
    "lookup_cache_static": ("ngram_cache", "lookup_cache_static"),
    "lookup_cache_dynamic": ("ngram_cache", "lookup_cache_dynamic"),
    **{f"spec_ngram_{k}_{f}": (f"ngram_{k}", f) for k in ("simple", "map_k", "map_k4v")
       for f in ("size_n", "size_m", "min_hits")},
}


def names(seq) -> list[str]:
    return [str(t) for t in seq]


# -- the reference types: nothing changed ------------------------------------

def test_the_derived_views_are_the_reference_tables():
    assert names(PRIORITY) == REFERENCE_PRIORITY
    assert list(PRIORITY) == [SpecType(n) for n in REFERENCE_PRIORITY]
    assert PRIORITY == tuple(SpecType(n) for n in REFERENCE_PRIORITY) and len(PRIORITY) == 10
    assert PRIORITY[:5] == tuple(SpecType(n) for n in REFERENCE_PRIORITY[:5])
    assert names(ALL_TYPES) == ["none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash",
                                "draft-dspark", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                                "ngram-cache"]
    assert names(SpecType) == names(ALL_TYPES) + ["auto"]
    assert all_types_str() == "auto," + ",".join(names(ALL_TYPES))
    assert NGRAM_TYPES == frozenset(PRIORITY[:5]) and MODEL_TYPES == frozenset(PRIORITY[5:])
    assert HIDDEN_STATE_TYPES == {SpecType.DRAFT_EAGLE3, SpecType.DRAFT_MTP, SpecType.DRAFT_DFLASH,
                                  SpecType.DRAFT_DSPARK}
    assert NGRAM_TYPES | {SpecType.DRAFT_MTP} == frozenset(PRIORITY[:5]) | {SpecType.DRAFT_MTP}
    assert set(_NGRAM_REASONS) == set(NGRAM_TYPES)
    assert names(implemented_types()) and set(implemented_types()) == set(PRIORITY)
    assert descriptor.load_needs(PRIORITY) == {"mtp"}
    assert names(descriptor.draft_model_types()) == ["draft-simple", "draft-eagle3", "draft-dflash",
                                                     "draft-dspark"]
    # the draft lengths (common_speculative_n_max), type by type and under auto
    p = SpecParams()
    assert [SpecParams.from_types(n).n_max_configured() for n in REFERENCE_PRIORITY] == \
        [p.ngram_simple.size_m] * 3 + [p.ngram_mod.n_max, 8] + [p.draft.n_max] * 5
    auto = SpecParams.auto()
    assert auto.n_max_configured() == 64
    auto.ngram_mod.n_max, auto.draft.n_max = 4, 70
    assert auto.n_max_configured() == 48
    auto.draft.model = "small.gguf"                  # draft-simple counts once a draft model is set
    assert auto.n_max_configured() == 70


def test_the_flag_map_and_the_settings_tables_are_the_reference_ones():
    from app import model_files, settings_form
    from app.options import _SPEC_FLAG_MAP
    assert dict(_SPEC_FLAG_MAP) == REFERENCE_FLAGS
    assert names(settings_form.SPEC_INFO) == REFERENCE_PRIORITY
    assert settings_form.SPEC_INFO[SpecType.DRAFT_MTP] == "the model's multi-token-prediction heads"
    assert names(settings_form.SPEC_FIELDS) == REFERENCE_PRIORITY[:6]
    assert settings_form.SPEC_FIELDS[SpecType.NGRAM_MOD] == [("ngram_mod.n_match", "match length", "int"),
                                                           ("ngram_mod.n_min", "min draft", "int"),
                                                           ("ngram_mod.n_max", "max draft", "int")]
    assert settings_form.SPEC_FIELDS[SpecType.DRAFT_SIMPLE] == [
        ("draft.model", "draft model", "path"), ("draft.n_max", "max draft tokens", "int"),
        ("draft.n_min", "min draft tokens", "int"), ("draft.p_min", "min probability", "float"),
        ("draft.n_gpu_layers", "draft GPU layers", "ngl"), ("draft.device", "draft devices", "str")]
    assert dict(model_files._DRAFTER_LABEL) == {SpecType.DRAFT_EAGLE3: "EAGLE3", SpecType.DRAFT_DFLASH: "DFlash",
                                                SpecType.DRAFT_DSPARK: "DSpark"}
    assert settings_form.field_hint("draft.device", "str") == "empty: as the model's · none: CPU only"
    assert settings_form.field_hint("ngram_cache.lookup_cache_static", "path") == "optional, must exist"
    assert settings_form.field_hint("ngram_mod.n_match", "int") == "default 24"
    assert settings_form.field_hint("ngram_simple.size_n", "int") == "default 12; 4 under auto"
    assert settings_form.field_hint("ngram_map_k.size_n", "int") == "default 12"
    assert list(model_files.availability(None, None)) == REFERENCE_PRIORITY


#: the reference types' flags as users see them in --help: (names, dest, help)
REFERENCE_HELP = [
    (("-md", "--spec-draft-model", "--model-draft"), "spec_draft_model", "draft model for draft-simple"),
    (("--spec-draft-n-max",), "spec_draft_n_max", "max draft tokens (default 3)"),
    (("--spec-draft-n-min",), "spec_draft_n_min", "min draft tokens (default 0)"),
    (("--spec-draft-p-min",), "spec_draft_p_min", "min draft probability (default 0)"),
    (("-ngld", "--spec-draft-ngl"), "spec_draft_ngl", "draft model layers on the GPU"),
    (("-devd", "--spec-draft-device", "--device-draft"), "spec_draft_device",
     "devices for the draft model (none = the CPU only; default: as --device)"),
    (("--spec-draft-ctx",), "spec_draft_ctx", "draft context size (default: target's)"),
    (("-td", "--spec-draft-threads"), "spec_draft_threads", "draft threads"),
    *[((f"--spec-{t}-size-n",), f"spec_{t.replace('-', '_')}_size_n",
       f"{t}: lookup n-gram length (default 12{'; 4 under auto' if t == 'ngram-simple' else ''})")
      for t in ("ngram-simple", "ngram-map-k", "ngram-map-k4v")],
]


def test_the_flags_say_what_they_did_with_defaults_read_from_the_parameters():
    from app.cli import build_parser
    flags = {f.dest: f for d in descriptor.descriptors() for f in d.flags}
    for names_, dest, help_ in REFERENCE_HELP:
        assert (flags[dest].names, flags[dest].help) == (names_, help_), dest
    assert flags["spec_ngram_mod_n_match"].help == "ngram-mod lookup length (default 24)"
    assert flags["spec_ngram_map_k4v_size_m"].help == "ngram-map-k4v: draft m-gram length (default 48)"
    assert flags["lookup_cache_static"].names == ("-lcs", "--lookup-cache-static")
    # each flag reads its value as its kind says, as the settings pane does
    args = build_parser().parse_args(["generate", "-ngld", "all", "--spec-draft-p-min", "0.5", "-md", "~/d.gguf",
                                      "--spec-ngram-mod-n-max", "7"])
    assert (args.spec_draft_ngl, args.spec_draft_p_min, args.spec_draft_model, args.spec_ngram_mod_n_max) == \
        (999, 0.5, "~/d.gguf", 7)


def test_the_theme_slots_are_the_type_names():
    import themes
    assert list(themes.SPEC_NAMES) == REFERENCE_PRIORITY == list(themes.SPEC_SLOTS)
    dark = themes.load_builtin()["dark"]
    assert set(dark.draft) == set(REFERENCE_PRIORITY)
    assert dark.draft_style("ngram-mod") == dark.draft["ngram-mod"]
    assert dark.draft_style("not-a-type").fg == dark.colors["accent"]      # unknown: the accent colour


# -- SpecType: a registry-backed string, as the enum was ------------------------

def _in_a_child(params: SpecParams) -> tuple[list[str], list[bool], SpecParams]:
    return ([repr(t) for t in params.types], [t is SpecType(t.value) for t in params.types if t.value != "ngram-toy"],
            params)


def test_spec_type_is_a_string_with_the_enums_manners():
    t = SpecType.NGRAM_MAP_K4V
    assert isinstance(t, str) and t == "ngram-map-k4v" and str(t) == "ngram-map-k4v" and f"{t}" == "ngram-map-k4v"
    assert t.value == "ngram-map-k4v" and type(t.value) is str and t.name == "NGRAM_MAP_K4V"
    assert repr(t) == "<SpecType.NGRAM_MAP_K4V: 'ngram-map-k4v'>"
    assert SpecType("ngram-map-k4v") is t and SpecType(t) is t and {t: 1}["ngram-map-k4v"] == 1
    assert pickle.loads(pickle.dumps(t)) is t and copy.deepcopy([t])[0] is t
    assert SpecType("none") is SpecType.NONE and SpecType("auto") is SpecType.AUTO
    with pytest.raises(ValueError):
        SpecType("ngram-fancy")


def test_spec_types_cross_a_process_boundary():
    toy = SpecDescriptor(name="ngram-toy", rank=45, kind=NGRAM, section="ngram_toy", section_factory=ToyParams)
    ctx = multiprocessing.get_context("spawn")
    with registered(toy) as t, ProcessPoolExecutor(1, mp_context=ctx) as pool:
        sp = SpecParams(types=[SpecType.NGRAM_SIMPLE, t, SpecType.DRAFT_MTP])
        sp.ngram_toy.n = 5
        reprs, same, back = pool.submit(_in_a_child, sp).result(timeout=120)
        assert reprs == ["<SpecType.NGRAM_SIMPLE: 'ngram-simple'>", "<SpecType.NGRAM_TOY: 'ngram-toy'>",
                         "<SpecType.DRAFT_MTP: 'draft-mtp'>"]
        assert same == [True, True]
        assert back == sp and back.types[1] is t and back.ngram_toy.n == 5


# -- a toy type, declared from here -----------------------------------------------

@dataclass
class ToyParams:
    n: int = 2
    token: int = 7

    def check(self, name: str) -> None:
        if self.n < 1:
            raise ParamError(f"{name}.n", "must be at least 1")


class Toy(Speculator):
    """Drafts a fixed continuation: ``token``, ``n`` times."""

    def __init__(self, p: ToyParams):
        super().__init__(p.n)
        self.token = p.token
        self.type = SpecType("ngram-toy")

    def draft(self, req: DraftRequest) -> list[int]:
        return [self.token] * self.n_max


TOY = SpecDescriptor(
    name="ngram-toy", rank=45, kind=NGRAM,
    info="drafts the same token again and again",
    needs=Nothing("always available: drafts a fixed continuation"),
    section="ngram_toy", section_factory=ToyParams, n_max=lambda p: p.ngram_toy.n,
    params=(Param("ngram_toy.n", "draft length", INT, ("--spec-ngram-toy-n",), "ngram-toy: draft length"),),
    color="#123456")


def make_toy(params: SpecParams, resources: dict) -> Speculator:
    return Toy(params.ngram_toy)


@pytest.fixture
def toy():
    with registered(TOY, make_toy) as t:
        yield t
    # withdrawn: everything is as before
    assert names(PRIORITY) == REFERENCE_PRIORITY and not hasattr(SpecType, "NGRAM_TOY")
    with pytest.raises(UnknownSpecType):
        parse_types("ngram-toy")


def test_a_toy_type_takes_its_place_in_the_types(toy):
    assert SpecType("ngram-toy") is toy is SpecType.NGRAM_TOY
    assert parse_types("ngram-cache,ngram-toy,ngram-simple") == [SpecType.NGRAM_SIMPLE, toy, SpecType.NGRAM_CACHE]
    assert names(PRIORITY) == REFERENCE_PRIORITY[:4] + ["ngram-toy"] + REFERENCE_PRIORITY[4:]   # rank 45
    assert toy in NGRAM_TYPES and toy not in MODEL_TYPES and toy in ALL_TYPES
    assert "ngram-toy" in all_types_str()
    assert pickle.loads(pickle.dumps(toy)) is toy


def test_a_toy_type_has_its_parameters_and_flags(toy):
    from app.cli import build_parser
    from app.options import _SPEC_FLAG_MAP, spec_from_args
    p = SpecParams.from_types("ngram-toy")
    assert p.ngram_toy == ToyParams() and p.n_max_configured() == 2
    p.ngram_toy.n = 0
    with pytest.raises(ParamError, match="ngram_toy.n"):
        p.validate()
    p.ngram_toy.n = 3
    d = p.to_dict()
    assert d["types"] == ["ngram-toy"] and d["ngram_toy"] == {"n": 3, "token": 7}
    assert SpecParams.from_dict(d) == p != SpecParams.from_types("ngram-toy")
    q = p.copy()
    q.ngram_toy.n = 4
    assert p.ngram_toy.n == 3
    # draftlight generate --spec-type ngram-toy --spec-ngram-toy-n 5
    assert _SPEC_FLAG_MAP["spec_ngram_toy_n"] == ("ngram_toy", "n")
    args = build_parser().parse_args(["generate", "-p", "hi", "--spec-type", "ngram-toy,ngram-mod",
                                      "--spec-ngram-toy-n", "5"])
    sp = spec_from_args(args)
    assert sp.types == [SpecType.NGRAM_MOD, toy] and sp.ngram_toy.n == 5 and sp.n_max_configured() == 64
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--spec-ngram-toy-n", "five"])


def test_a_toy_type_is_in_automatics_plan_and_the_chain_builds_it(toy):
    plan = auto_plan(model_path=None)
    assert [c.name for c in plan] == names(PRIORITY)
    assert plan[4] == ("ngram-toy", True, "always available: drafts a fixed continuation")
    assert _NGRAM_REASONS[toy] == "always available: drafts a fixed continuation"
    assert SpecParams.auto().n_max_configured() == 64
    # asked after ngram-mod (which has nothing yet), before ngram-cache
    chain = SpeculatorChain.from_params(SpecParams.from_types("ngram-cache,ngram-toy,ngram-mod"))
    assert [s.name for s in chain.speculators] == ["ngram-mod", "ngram-toy", "ngram-cache"]
    chain.begin([1, 2, 3])
    assert chain.draft(DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=8)) == [7, 7]
    assert chain.last_drafter == "ngram-toy"
    chain.accept(1)
    assert chain.stats()["ngram-toy"].n_acc_tokens == 1
    chain.close()
    auto = SpeculatorChain.from_params(SpecParams.auto())
    assert "ngram-toy" in [s.name for s in auto.speculators]
    assert ("ngram-toy", True, "always available: drafts a fixed continuation") in auto.auto_plan
    auto.close()


def test_a_toy_type_in_the_settings_tables_and_the_themes(toy):
    import themes
    from app.model_files import availability
    from app.settings_form import SPEC_FIELDS, SPEC_INFO, field_hint
    assert SPEC_INFO[toy] == "drafts the same token again and again"
    assert SPEC_FIELDS[toy] == [("ngram_toy.n", "draft length", "int")]
    assert field_hint("ngram_toy.n", "int") == "default 2"
    avail = availability(None, None)
    assert list(avail) == names(PRIORITY) and avail["ngram-toy"] is None
    assert "ngram-toy" in themes.SPEC_NAMES
    dark = themes.load_builtin()["dark"]
    assert dark.draft_style("ngram-toy").fg == "#123456"             # no colour in the theme: its own
    mine = themes.parse_theme({"name": "t", "colors": {"primary": "#123"}, "draft": {"ngram-toy": "#f00"}})
    assert mine.draft_style("ngram-toy").fg == "#ff0000"


async def test_the_settings_pane_shows_a_toy_type(toy):
    from textual.widgets import Switch
    from .test_ui_app import make_app, open_settings, ready
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        switches = [s.id[3:] for s in app.screen.query(Switch)]
        assert switches == ["auto"] + names(PRIORITY) and "ngram-toy" in switches
        assert not app.screen.query_one("#sw-ngram-toy").disabled
        assert str(app.screen.query_one("#desc-ngram-toy").render()) == "drafts the same token again and again"
        assert app.screen.query_one("#f-ngram_toy--n").value == "2"


def test_a_toy_parameter_declared_once_is_a_flag_a_field_a_config_key_and_help(toy, tmp_path, capsys):
    """The toy's one Param: its flag (with its help), its settings field, its config key; nothing
    else was edited for it."""
    from app import config as config_mod
    from app.cli import build_parser
    from app.settings_form import SPEC_FIELDS, field_hint
    assert descriptor.get("ngram-toy").flags == (
        Flag(("--spec-ngram-toy-n",), "spec_ngram_toy_n", "ngram_toy.n", "int", "ngram-toy: draft length (default 2)"),)
    assert descriptor.get("ngram-toy").fields == (Setting("ngram_toy.n", "draft length", "int"),)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["chat", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--spec-ngram-toy-n SPEC_NGRAM_TOY_N ngram-toy: draft length (default 2)" in help_text
    assert SPEC_FIELDS[toy] == [("ngram_toy.n", "draft length", "int")]
    assert field_hint("ngram_toy.n", "int") == "default 2"
    # the config key: [speculation.ngram_toy] n, written and read back
    cfg = config_mod.Config(spec=SpecParams.from_types("ngram-toy"))
    cfg.spec.ngram_toy.n = 6
    path = config_mod.save(cfg, tmp_path / "config.toml")
    text = path.read_text(encoding="utf-8")
    assert "[speculation.ngram_toy]" in text and "n = 6" in text
    back = config_mod.load(path)
    assert back.spec.types == [toy] and back.spec.ngram_toy.n == 6 and back.spec.ngram_toy.token == 7


def test_a_parameters_default_is_read_from_its_dataclass():
    """The same Param over a section whose default differs says that default, in the flag's help
    and the field's hint: no default is written into a declaration."""
    from app.settings_form import field_hint

    @dataclass
    class Nine:
        n: int = 9
    desc = SpecDescriptor(name="ngram-nine", rank=46, kind=NGRAM, section="ngram_nine", section_factory=Nine,
                          params=(Param("ngram_nine.n", "draft length", INT, ("--spec-ngram-nine-n",),
                                        "ngram-nine: draft length", default_note="3 under auto"),))
    assert desc.flags[0].help == "ngram-nine: draft length (default 9; 3 under auto)"
    assert desc.fields[0].hint == "default 9; 3 under auto"
    with registered(desc):
        assert field_hint("ngram_nine.n", "int") == "default 9; 3 under auto"
    with pytest.raises(ValueError, match="no defaults for the parameter section 'nowhere'"):
        SpecDescriptor(name="ngram-nowhere", rank=47, kind=NGRAM,
                       params=(Param("nowhere.n", "n", INT, ("--x",), "x"),))


def test_a_drafter_type_says_what_it_needs(tmp_path):
    """A model-based toy: it needs a drafter of its own architecture, and says so."""
    from app import model_files as screens
    from speculators.engine import load_plan
    desc = SpecDescriptor(name="draft-toy", rank=105, kind=HIDDEN, info="a toy drafter",
                          needs=Drafter(label="Toy", arch="toy"), drafter_label="Toy", section="draft",
                          n_max=lambda p: max(0, p.draft.n_max))

    def make(params, resources):
        raise Unavailable("no toy drafter is loaded")
    with registered(desc, make) as t:
        assert names(PRIORITY)[-1] == "draft-toy" and t in HIDDEN_STATE_TYPES and t in MODEL_TYPES
        assert {c.name: c.reason for c in auto_plan(model_path=None)}["draft-toy"] == "no draft model is set"
        assert screens.availability(None, None)["draft-toy"] == \
            "needs a Toy drafter: set the draft model under draft-simple"
        drafter = write_header_only(tmp_path / "toy.gguf", "toy", ["blk.0.attn_q.weight"], block_count=1)
        sp = SpecParams.auto()
        sp.draft.model = str(drafter)
        plan = {c.name: c for c in auto_plan(sp, None)}
        assert plan["draft-toy"] == ("draft-toy", True, "Toy drafter toy.gguf")
        assert not plan["draft-simple"].used and not plan["draft-eagle3"].used
        assert screens.availability(None, str(drafter))["draft-toy"] is None
        assert "the draft model is not one" in screens.availability(None, str(drafter))["draft-eagle3"]
        # the engine's load plan (unchanged code) sizes its snapshots for a hidden-state type
        assert load_plan("any.gguf", SpecParams.from_types("draft-toy")).n_rs_seq == sp.draft.n_max
        assert load_plan("any.gguf", SpecParams.from_types("draft-toy")).load_mtp is False
        # Automatic uses the draft model through it: no "draft model not used" warning
        from app.runtime import draft_model_warning
        assert draft_model_warning(sp, auto_plan(sp, None)) is None
        chain = SpeculatorChain.from_params(SpecParams.from_types("draft-toy,ngram-mod"))
        assert chain.skipped == {"draft-toy": "no toy drafter is loaded"}
        chain.close()
    chain = SpeculatorChain.from_params(SpecParams.from_types("draft-simple"))   # and gone again
    assert "draft-toy" not in screens.availability(None, None) and chain.skipped["draft-simple"]
    chain.close()


def test_what_a_type_needs_loaded_comes_from_its_descriptor():
    """A toy type whose descriptor says the target must load its MTP heads gets them loaded."""
    from speculators.engine import load_plan
    desc = SpecDescriptor(name="draft-toymtp", rank=106, kind=HIDDEN, info="a toy MTP drafter",
                          section="draft", load=frozenset({"mtp"}))
    assert load_plan("any.gguf", SpecParams.from_types("ngram-mod")).load_mtp is False
    with registered(desc, lambda params, resources: None):
        assert load_plan("any.gguf", SpecParams.from_types("draft-toymtp")).load_mtp is True


def test_a_declaration_is_checked():
    with pytest.raises(ValueError, match="rank 40 is taken by ngram-mod"):
        descriptor.declare(SpecDescriptor(name="ngram-other", rank=40, kind=NGRAM))
    with pytest.raises(ValueError, match="invalid speculator type name"):
        SpecDescriptor(name="auto", rank=1000, kind=NGRAM)
    with pytest.raises(ValueError, match="kind must be one of"):
        SpecDescriptor(name="ngram-x", rank=1000, kind="magic")
    assert names(PRIORITY) == REFERENCE_PRIORITY


def test_what_a_drafter_file_is_comes_from_the_descriptors(tmp_path):
    """A toy type that recognises its drafter by a tensor of its own: the GGUF detection (the
    picker, Automatic's plan) finds it, with no other file changed; llama.cpp's three are as before."""
    from speculators.gguf_detect import types_from_gguf
    desc = SpecDescriptor(name="draft-toyhead", rank=107, kind=HIDDEN, info="a toy head drafter",
                          needs=Drafter(label="Toyhead"), section="draft",
                          detect=lambda info: "toyhead.weight" in (info.tensors or {}))
    f = write_header_only(tmp_path / "toyhead.gguf", "llama", ["toyhead.weight"], block_count=1)
    other = write_header_only(tmp_path / "plain.gguf", "llama", ["blk.0.attn_q.weight"], block_count=1)
    assert types_from_gguf(f) == []
    with registered(desc, lambda params, resources: None) as t:
        assert types_from_gguf(f) == [t] and types_from_gguf(other) == []
        sp = SpecParams.auto()
        sp.draft.model = str(f)
        plan = {c.name: c for c in auto_plan(sp, None)}
        assert plan["draft-toyhead"] == ("draft-toyhead", True, "Toyhead drafter toyhead.gguf")
    assert types_from_gguf(tmp_path / "toyhead.gguf") == []
    mtp = write_header_only(tmp_path / "mtp.gguf", "qwen35", ["blk.1.nextn.eh_proj.weight"], block_count=2)
    dflash = write_header_only(tmp_path / "df.gguf", "dflash", ["fc.weight"])
    dspark = write_header_only(tmp_path / "ds.gguf", "dflash", ["fc.weight", "markov_w1.weight"])
    assert [types_from_gguf(p) for p in (mtp, dflash, dspark, other)] == \
        [[SpecType.DRAFT_MTP], [SpecType.DRAFT_DFLASH], [SpecType.DRAFT_DSPARK], []]
