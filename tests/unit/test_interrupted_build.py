"""A Ctrl-C that lands while pydantic-core builds a model's validator (on its first use:
defer_build) comes out of pydantic as a SchemaError, not a KeyboardInterrupt. launcher still
takes it for the Ctrl-C it is: exit 130 and "interrupted", no traceback."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict
from pydantic_core import SchemaError

from launcher.cli.context import AppContext
from launcher.cli.main import run_guarded
from launcher.config import models as config
from launcher.config.models import interrupted_build
from launcher.config.yamlsource import YamlDocument
from launcher.core.errors import ExitCode


class Wide(BaseModel):
    """Enough fields that a build takes a while to interrupt."""

    model_config = ConfigDict(defer_build=True, extra="forbid")
    a: Literal["x", "y", "z"] = "x"
    b: dict[str, list[int]] = {}
    c: tuple[float, ...] = ()
    d: int | str | None = None
    e: list[dict[str, tuple[int, str]]] = []


class Alarm:
    """SIGALRM's handler: one KeyboardInterrupt per arming, none once disarmed, so an alarm that
    Python handles late (after the attempt ended) cannot interrupt the test itself."""

    armed = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


def interrupted_schema_error() -> SchemaError:
    """What pydantic-core raises when a SIGINT's handler raises while it builds a validator:
    found by interrupting builds at spread-out moments (about 1 in 30 lands in the build)."""
    alarm = Alarm()
    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        for attempt in range(20_000):
            alarm.armed = True
            signal.setitimer(signal.ITIMER_REAL, 0.0002 + (attempt % 40) * 0.00005)
            # Bounded: an interrupt that something swallowed must not leave the loop spinning.
            give_up = time.monotonic() + 0.5
            try:
                while time.monotonic() < give_up:
                    Wide.model_rebuild(force=True)
            except KeyboardInterrupt:
                pass
            except SchemaError as error:
                return error
            finally:
                alarm.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
        Wide.model_rebuild(force=True)
    pytest.fail("no interrupt landed inside pydantic-core's build in 20,000 tries")


@pytest.fixture(scope="module")
def schema_error() -> SchemaError:
    return interrupted_schema_error()


def test_pydantic_core_turns_the_interrupt_into_a_schema_error(schema_error: SchemaError) -> None:
    assert schema_error.__cause__ is None and schema_error.__context__ is None
    assert interrupted_build(schema_error), str(schema_error)


def test_other_schema_errors_are_not_interrupts() -> None:
    from pydantic_core import SchemaValidator

    with pytest.raises(SchemaError) as raised:
        SchemaValidator({"type": "no-such-type"})
    assert not interrupted_build(raised.value)
    assert not interrupted_build(KeyError("KeyboardInterrupt:"))


def validate_a_playbook_interrupted(error: SchemaError) -> None:
    """config._validate with a model whose first validation is interrupted in its build."""

    class Building:
        @staticmethod
        def model_validate(data: Any) -> Any:
            raise error

    document = YamlDocument(Path("playbook.yaml"), {"name": "x"}, None)
    config._validate(document, Building, "a playbook")  # type: ignore[arg-type]


def test_config_validation_raises_it_as_keyboard_interrupt(schema_error: SchemaError) -> None:
    with pytest.raises(KeyboardInterrupt):
        validate_a_playbook_interrupted(schema_error)


def test_the_cli_exits_130_without_a_traceback(
    schema_error: SchemaError, capsys: pytest.CaptureFixture[str]
) -> None:
    def body() -> int:
        validate_a_playbook_interrupted(schema_error)
        return 0

    with pytest.raises(SystemExit) as exited:
        run_guarded(AppContext(None), body, debug=False)
    assert exited.value.code == ExitCode.INTERRUPTED
    err = capsys.readouterr().err
    assert err.strip() == "interrupted" and "Traceback" not in err
