"""Record the warm-ups OMGS-SGD plans from in the OMGS timing samples (``data/calibration/omgs_timing_inputs.json``).

OMGS-SGD plans online from the trace and cost model its warm-up measures; on shared CPU cores both vary
from run to run, and so does the plan (tiny_resnet: 7 to 11 buckets at density 0.001), which made the
measured OMGS vs TopK-SGD verdict depend on the run. The notebook's timing samples therefore plan from one
recorded warm-up per model (:func:`repro.studies.timing.load_plan_inputs`); this script records it, under the
notebook's default settings (2 ranks, batch 32, emulated 10 Mbit/s links: needs root, else loopback).

    python scripts/record_timing_inputs.py      # about 30 s on 2 cores
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.core.paths import shipped_path  # noqa: E402
from repro.studies import timing  # noqa: E402

MODELS = ("tiny_resnet", "tiny_lstm")
SETTINGS = {"workers": 2, "batch_size": 32, "emulate_bandwidth": "10mbit"}


def main() -> None:
    from repro.studies.validation import usable_bandwidths

    bw = (usable_bandwidths([SETTINGS["emulate_bandwidth"]]) or [None])[0]
    settings = {**SETTINGS, "emulate_bandwidth": bw}
    inputs = {m: timing.record_plan_inputs(m, {"scheduler": "omgs", "density": 0.001}, settings["workers"],
                                           warmup_steps=8, fit_repeats=5, batch_size=settings["batch_size"],
                                           emulate_bandwidth=bw)
              for m in MODELS}
    out = shipped_path("calibration", "omgs_timing_inputs.json")
    timing.save_plan_inputs(out, inputs, settings, "scripts/record_timing_inputs.py: one OMGS warm-up of 8 steps "
                            "per model, cost fitted with 5 repeats per size, gloo on 2 CPU ranks")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
