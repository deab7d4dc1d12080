"""Record the warm-ups the online planners plan from in the training notebooks' timing samples.

MG-WFBP, the exact optimum and OMGS-SGD plan online from the trace and cost model their warm-up measures;
on shared CPU cores both vary from run to run, and so does the plan (at the notebooks' defaults: MG-WFBP
3 to 14 buckets, OMGS-SGD on tiny_resnet 7 to 11), which made the measured verdicts depend on the plan a
run drew. The notebooks' timing samples therefore plan from one recorded warm-up per model
(:func:`repro.studies.timing.load_plan_inputs`); this script records them under each notebook's default
settings (2 ranks, batch 32, its emulated link: needs root, else loopback), as

- ``data/calibration/mgwfbp_timing_inputs.json`` (mgwfbp_training: MG-WFBP's warm-up, all-reduce cost), and
- ``data/calibration/omgs_timing_inputs.json`` (omgs_training: OMGS-SGD's warm-up, sparse costs).

    python scripts/record_timing_inputs.py      # about a minute on 2 cores
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.core.paths import shipped_path  # noqa: E402
from repro.studies import timing  # noqa: E402

#: file -> (the scheduler whose warm-up is recorded, models, the notebook's link rate)
RECORDINGS = {
    "mgwfbp_timing_inputs.json": ({"scheduler": "mgwfbp"}, ("tiny_resnet",), "100mbit"),
    "omgs_timing_inputs.json": ({"scheduler": "omgs", "density": 0.001}, ("tiny_resnet", "tiny_lstm"), "10mbit"),
}
WORKERS, BATCH_SIZE = 2, 32


def main() -> None:
    from repro.studies.validation import usable_bandwidths

    for name, (spec, models, rate) in RECORDINGS.items():
        bw = (usable_bandwidths([rate]) or [None])[0]
        settings = {"workers": WORKERS, "batch_size": BATCH_SIZE, "emulate_bandwidth": bw}
        inputs = {m: timing.record_plan_inputs(m, spec, WORKERS, warmup_steps=8, fit_repeats=5, batch_size=BATCH_SIZE,
                                               emulate_bandwidth=bw)
                  for m in models}
        out = shipped_path("calibration", name)
        timing.save_plan_inputs(out, inputs, settings,
                                f"scripts/record_timing_inputs.py: one {spec['scheduler']} warm-up of 8 steps per "
                                f"model, cost fitted with 5 repeats per size, gloo on {WORKERS} CPU ranks")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
