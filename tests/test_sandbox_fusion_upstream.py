"""Docker-free checks of what air's SandboxFusion service takes from upstream's server (469de08): README's table
of deliberate differences is the one the tests declare (sf_upstream.differs), and the request planning that
decides a status (Scala's object, files upstream cannot write, timeouts of 0, memory limits) does what upstream's
runners do. The requests themselves, against real sandboxes: test_sandbox_fusion_compat.py."""

from __future__ import annotations

import base64

import pytest
from sf_upstream import BEGIN, README, readme_table, table

from air.services.sandbox_fusion import RunCodeRequest, SandboxFusionConfig, SandboxFusionService
from air.services.sandbox_fusion.files import Rejected, UpstreamSandboxError
from air.services.sandbox_fusion.recipes import CompileRefused
from air.services.sandbox_fusion.service import memory_limits


def test_readme_lists_exactly_the_differences_the_tests_prove():
    text = README.read_text()
    assert BEGIN in text, "docs/sandbox-fusion.md lost its table of differences from SandboxFusion"
    assert readme_table(text) == table(), "docs/sandbox-fusion.md's table of differences is stale: " \
        "`python tests/sf_upstream.py`"


def service(**config) -> SandboxFusionService:
    sf = SandboxFusionService(SandboxFusionConfig(**config))
    sf.available = {"python": "", "scala": "", "cpp": ""}
    return sf


@pytest.mark.parametrize("code, main", [
    ("object Main { def main(a: Array[String]): Unit = () }", "Main"),
    ("object   Solution extends App { println(1) }", "Solution"),
    ("// the object\nobject Main", "object"),  # upstream's pattern takes a comment's word too
    ("class NoObject", None),
    # upstream takes the first of `object NAME` and ` extends NAME {`: a class extending something comes first
    ("class A extends Object {}\nobject Main { def main(a: Array[String]): Unit = () }", None),
    ("class A extends B\nobject Main", "Main"),  # no brace after B: the object is the first match
])
def test_scalas_object_is_found_as_upstream_finds_it(code, main):
    request = RunCodeRequest(code=code, language="scala")
    if main is None:
        with pytest.raises(CompileRefused, match="Object name not found."):
            service()._plan(request)
    else:
        assert service()._plan(request).run.endswith(f"exec scala {main}")


@pytest.mark.parametrize("files, error", [
    ({"a.txt": "abc"}, UpstreamSandboxError),  # padding
    ({"a.txt": "!!!notbase64"}, UpstreamSandboxError),
    ({"a": "eA==", "a/b": "eA=="}, UpstreamSandboxError),  # a file and a directory
    ({"n" * 300: "eA=="}, UpstreamSandboxError),  # no file system holds the name
    ({"a\0b": "eA=="}, UpstreamSandboxError),
    ({"../x": "eA=="}, Rejected),  # upstream writes it, out of its directory: air refuses
    ({"/proc/1/environ": "eA=="}, Rejected),
    ({"ok.txt": base64.b64encode(b"fine").decode(), "skipped IGNORE_THIS_FILE": "!", "none.txt": None}, None),
])
def test_files_upstream_cannot_write_are_its_sandbox_error(files, error):
    request = RunCodeRequest(code="print(1)", language="python", files=files)
    if error is None:
        assert service()._plan(request).files["ok.txt"] == b"fine"
    else:
        with pytest.raises(error):
            service()._plan(request)


def test_a_timeout_of_zero_or_less_is_kept_to_time_out_at_once_and_a_long_one_is_lowered():
    plan = service()._plan(RunCodeRequest(code="int main() {}", language="cpp", compile_timeout=0, run_timeout=-1))
    assert (plan.compile_timeout, plan.run_timeout, plan.notes) == (0, -1, [])
    plan = service(max_run_timeout=30)._plan(RunCodeRequest(code="print(1)", language="python", run_timeout=0.01,
                                                            compile_timeout=99))
    assert plan.run_timeout == 0.01 and plan.notes == []  # compile_timeout of an interpreted language: unused
    plan = service(max_run_timeout=30)._plan(RunCodeRequest(code="print(1)", language="python", run_timeout=99))
    assert plan.run_timeout == 30 and plan.notes == ["run_timeout 99s lowered to this server's maximum 30s"]


def test_memory_limits_are_upstreams_or_the_data_segments():
    kb = 1024 * 1024
    upstream = f"ulimit -S -v {kb} && ulimit -S -d {kb} && ulimit -S -s {kb} && "
    assert memory_limits("sandbox-fusion", 1024) == (upstream, upstream)  # compile and run, as its preexec_fn
    assert memory_limits("data", 1024) == ("", f"ulimit -d {kb} && ")
    assert memory_limits("sandbox-fusion", -1) == memory_limits("data", 0) == ("", "")
    plan = service()._plan(RunCodeRequest(code="int main() {}", language="cpp", memory_limit_MB=1024))
    assert plan.compile.startswith(upstream + "exec g++ ") and plan.run == upstream + "exec ./test"
