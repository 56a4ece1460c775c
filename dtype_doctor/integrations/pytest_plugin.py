"""The `dtype_doctor` pytest fixture: a test fails when the model step it checks has findings.

    def test_training_step(dtype_doctor):
        model, batch = build()
        dtype_doctor.check(model, batch, train=True)      # traced with diagnose()
        with dtype_doctor.watch(model):                    # or: the test's own step, traced
            model(**batch).loss.backward()

After the test body, every report the fixture made is checked: findings at or above
`fail_on` (default error; `@pytest.mark.dtype_doctor(fail_on="warning")` or the
`dtype_doctor_fail_on` ini option) fail the test, each finding named. Registered through the
`pytest11` entry point; torch is imported only when a test uses the fixture.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest


class DoctorFixture:
    def __init__(self, fail_on: str) -> None:
        self.fail_on = fail_on
        self.reports: list[Any] = []

    def check(self, model: Any, inputs: Any, **options: Any) -> Any:
        """`dtype_doctor.diagnose(model, inputs, **options)`; the report counts for this test."""
        from dtype_doctor.diagnosis import diagnose

        report = diagnose(model, inputs, **options)
        self.reports.append(report)
        return report

    @contextlib.contextmanager
    def watch(self, model: Any, **options: Any) -> Iterator[Any]:
        """Trace the block's own forward/backward; dtype and device errors are stepped over and reported."""
        from dtype_doctor.diagnosis import watch

        w = watch(model, raise_errors=False, **options)
        try:
            with w:
                yield w
        finally:
            if w.report is not None:
                self.reports.append(w.report)

    def problems(self) -> list[Any]:
        return [f for report in self.reports for f in report.at_or_above(self.fail_on)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "dtype_doctor(fail_on='error'): the severity at which the dtype_doctor fixture fails the test")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("dtype_doctor_fail_on", "severity at which the dtype_doctor fixture fails a test", default="error")


@pytest.fixture
def dtype_doctor(request: pytest.FixtureRequest) -> DoctorFixture:
    marker = request.node.get_closest_marker("dtype_doctor")
    fail_on = (marker.kwargs.get("fail_on") if marker else None) or request.config.getini("dtype_doctor_fail_on")
    return DoctorFixture(fail_on)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    doctor = getattr(item, "funcargs", {}).get("dtype_doctor")
    if isinstance(doctor, DoctorFixture) and (problems := doctor.problems()):
        lines = [f"dtype-doctor: {len(problems)} finding{'s' if len(problems) != 1 else ''} at or above {doctor.fail_on}:"]
        lines += [f"  {f.code} {f.severity} at {f.module or '<model>'}: {f.message}" for f in problems]
        pytest.fail("\n".join(lines), pytrace=False)
    return result
