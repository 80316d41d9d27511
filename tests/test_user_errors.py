"""One list of the errors a person is shown as they are (app/errors.py): the UI's ``describe`` and
the commands' one-line report read the same list."""

from __future__ import annotations

import pytest

from app import cli, errors
from app.config import ConfigError
from speculators.devices import DeviceError
from speculators.params import ParamError


def test_the_commands_catch_every_user_error_and_the_file_errors():
    caught = errors.expected_errors()
    assert set(errors.user_error_types()) <= set(caught)
    assert errors.UserError in caught and set(errors.FILE_ERRORS) <= set(caught)
    assert issubclass(cli.CliError, errors.UserError)
    assert set(errors.user_errors()) == {errors.UserError, *errors.user_error_types()}
    for cls in errors.user_error_types():
        assert issubclass(cls, errors.UserError), cls


@pytest.mark.parametrize("error", [DeviceError("no such device: CUDA7"),       # once missing from the UI's list
                                   ConfigError("bad value in config: x"),       # once missing from the commands'
                                   ParamError("draft.n_max", "must be >= 0"),
                                   cli.CliError("the prompt is empty")])
def test_a_user_error_is_one_line_in_a_command_and_in_the_ui(error, monkeypatch, capsys):
    from app import cmd_doctor

    def fail(args):
        raise error
    monkeypatch.setattr(cmd_doctor, "run", fail)
    assert cli.main(["doctor"]) == 1
    assert capsys.readouterr().err == f"draftlight: error: {error}\n"
    assert errors.describe(error) == str(error)         # no "(DeviceError)": a message for people


def test_an_except_clause_catches_an_engine_error_by_the_list_not_by_the_base_class():
    try:
        try:
            raise ParamError("draft.n_max", "must be >= 0")
        except errors.UserError:          # virtual subclasses are not matched by except
            pytest.fail("except UserError caught a virtual subclass")
    except errors.user_errors() as e:
        assert errors.describe(e) == "draft.n_max: must be >= 0"


def test_anything_else_is_not_a_user_error(monkeypatch):
    from app import cmd_doctor

    def fail(args):
        raise KeyError("x")
    monkeypatch.setattr(cmd_doctor, "run", fail)
    with pytest.raises(KeyError):
        cli.main(["doctor"])
    assert errors.describe(KeyError("x")) == "'x' (KeyError)"


@pytest.mark.parametrize("action, method", [("regenerate", "regenerate"), ("edit_last", "edit_last")])
async def test_an_engine_error_in_a_chat_action_is_a_message_and_the_chat_goes_on(action, method, monkeypatch):
    """``except UserError`` does not catch the engine's errors (they are UserErrors only through
    ``issubclass``, which ``except`` does not ask): the chat's actions catch ``user_errors()``."""
    from speculators.llama import ContextFull
    from tests.test_ui_app import make_app, ready, send_and_wait, until

    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await send_and_wait(pilot, app)

        def fails(*_a, **_k):
            raise ContextFull("context full (300 > 256 tokens)")
        monkeypatch.setattr(app.session, method, fails)
        shown: list[str] = []
        notify = app.notify
        monkeypatch.setattr(app, "notify", lambda msg, *a, **k: (shown.append(str(msg)), notify(msg, *a, **k)))
        await app.run_action(action)
        await until(pilot, lambda: shown)
        assert "context full (300 > 256 tokens)" in shown[0].lower()
        assert app.is_running and app.session.turns        # the chat is still there
