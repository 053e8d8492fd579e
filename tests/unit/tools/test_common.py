"""The client tools' shared pieces: one host:port parser (perf's -u and analyze's --url agree), the entry point's
exit codes and error lines, the flag parser of both, and the lazy exports of the tool packages."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from nereid.tools.analyze.cli import parse_analyze_args
from nereid.tools.analyze.deployment import split_host_port as analyze_split
from nereid.tools.analyze.settings import AnalyzeError
from nereid.tools.common import AddressError, lazy_exports, run_tool, split_host_port
from nereid.tools.perf.cli import parse_perf_args
from nereid.tools.perf.config import PerfError
from nereid.tools.perf.control_client import split_url as perf_split


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("localhost:8000", ("localhost", 8000)),
        ("localhost", ("localhost", 8001)),
        ("http://127.0.0.1:9000/v2/health", ("127.0.0.1", 9000)),
        ("grpc://example:1234", ("example", 1234)),
        ("[::1]:8005", ("::1", 8005)),
        ("[::1]", ("::1", 8001)),
        ("::1", ("::1", 8001)),  # a bare IPv6 address is a host, not host "::" and port 1
        ("  host:1  ", ("host", 1)),
    ],
)
def test_perf_and_analyze_read_server_addresses_alike(url: str, expected: tuple[str, int]) -> None:
    assert split_host_port(url, 8001) == expected
    assert perf_split(url, 8001) == expected
    assert analyze_split(url, 8001) == expected


@pytest.mark.parametrize(
    ("url", "words"),
    [(":8000", "expected host:port"), ("host:http", "numeric port"), ("host:0", "out of range"), ("host:70000", "out of range")],
)
def test_bad_addresses_are_refused_naming_the_flag_in_each_tools_error_type(url: str, words: str) -> None:
    with pytest.raises(AddressError, match=words) as plain:
        split_host_port(url, 8000, "--grpc-url")
    assert str(plain.value).startswith("--grpc-url: ")
    with pytest.raises(PerfError, match=f"^-u: .*{words}"):
        perf_split(url, 8000)
    with pytest.raises(AnalyzeError, match=f"^--url: .*{words}"):
        analyze_split(url, 8000)


class _Oops(Exception):
    pass


def _tool(run: object, argv: tuple[str, ...] = ("x",)) -> int:
    def default_parse(argv: list[str]) -> list[str]:
        if "--bad" in argv:
            raise _Oops("--bad: not a flag")
        return argv

    return run_tool(
        list(argv),
        prog="nereid demo",
        print_help=lambda: sys.stdout.write("usage: demo\n"),
        parse=default_parse,
        run=run,  # type: ignore[arg-type]
        error=_Oops,
        verbose=lambda parsed: False,
        debug_env="NEREID_DEMO_DEBUG_NOT_SET",
    )


def test_run_tool_exit_codes_and_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert _tool(lambda parsed: 0) == 0
    assert _tool(lambda parsed: 0, ("--bad",)) == 2
    assert capsys.readouterr().err == "nereid demo: error: --bad: not a flag\n"

    def fails(parsed: list[str]) -> int:
        raise _Oops("the server went away")

    assert _tool(fails) == 1
    assert capsys.readouterr().err == "nereid demo: error: the server went away\n"

    def interrupted(parsed: list[str]) -> int:
        raise KeyboardInterrupt

    assert _tool(interrupted) == 130

    def buggy(parsed: list[str]) -> int:
        raise ZeroDivisionError("division by zero")

    assert _tool(buggy) == 1
    err = capsys.readouterr().err
    assert "internal error: ZeroDivisionError: division by zero" in err
    assert "Traceback" not in err  # only with -v or the debug variable


def test_help_prints_usage_without_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    status = run_tool(
        ["--bad", "-h"],
        prog="nereid demo",
        print_help=lambda: sys.stdout.write("usage: demo\n"),
        parse=lambda argv: (_ for _ in ()).throw(AssertionError("parsed")),
        run=lambda parsed: 1,
        error=_Oops,
        verbose=lambda parsed: False,
        debug_env="X",
    )
    assert status == 0
    assert capsys.readouterr().out == "usage: demo\n"


def test_lazy_exports_import_on_first_use_and_refuse_unknown_names() -> None:
    namespace: dict[str, object] = {}
    getattr_ = lazy_exports("json", {"JSONDecoder": "decoder"}, namespace)
    from json.decoder import JSONDecoder

    assert getattr_("JSONDecoder") is JSONDecoder
    assert namespace["JSONDecoder"] is JSONDecoder  # kept, so the next lookup is a plain global
    with pytest.raises(AttributeError, match="module 'json' has no attribute 'nothing'"):
        getattr_("nothing")


def test_tool_packages_export_lazily() -> None:
    import nereid.tools.analyze as analyze
    import nereid.tools.perf as perf

    assert perf.PerfConfig.__module__ == "nereid.tools.perf.config"
    assert analyze.AnalyzeSettings.__module__ == "nereid.tools.analyze.settings"
    with pytest.raises(AttributeError):
        _ = perf.no_such_name


@pytest.mark.parametrize(
    ("parse", "error", "prog"),
    [(parse_perf_args, PerfError, "nereid perf"), (parse_analyze_args, AnalyzeError, "nereid analyze")],
)
def test_each_tools_parser_refuses_bad_flags_with_its_own_error(
    parse: Callable[[list[str]], object], error: type[Exception], prog: str
) -> None:
    with pytest.raises(error, match=rf"unknown flag\(s\): --bogus\. Run `{prog} --help` for the flags"):
        parse(["-m", "simple", "--bogus"])
    with pytest.raises(error, match=r"argument -b(/--batch-size)?: invalid int value: 'many'"):
        parse(["-m", "simple", "-b", "many"])
    with pytest.raises(error, match="required"):
        parse([])
