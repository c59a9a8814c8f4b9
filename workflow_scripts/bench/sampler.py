"""Does the VRAM sampler slow training? (`snakemake --cores all bench_sampler --configfile <study>`)

The same run (`bench.model`, `bench.lever_strategy`, `bench.world_size`, `bench.train`) through the pipeline's own
launcher, with the sampler on (`sampler.backend` of the study) and off (`none`), interleaved over `bench.rounds`
pairs (on/off, then off/on). Both arms publish the training step to the step file; only the sampler differs.

Writes into --out-dir: sampler_overhead_rounds.csv (one row per run), sampler_overhead.csv / .md: mean tokens/s
per arm and the throughput ratio with / without the sampler, with the 95% CI of the per-pair ratios.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from workflow_scripts.bench.harness import Rounds, spec_for
from workflow_scripts.job.lever_trial import run_launcher
from workflow_scripts.report.stats import mean_ci


def run_pairs(config: dict, out: Path, rounds: Rounds) -> None:
    b = config["bench"]
    backend = config["sampler"].get("backend", "auto")
    for r in range(b["rounds"]):
        arms = [("on", backend), ("off", "none")]
        for arm, arm_backend in arms if r % 2 == 0 else arms[::-1]:
            if rounds.done(arm=arm, repeat=r):
                continue
            spec = spec_for(config, b["lever_strategy"], {}, out, f"sampler/{arm}/r{r}", r)
            spec["sampler"] = {**spec["sampler"], "backend": arm_backend}
            print(f"sampler {arm} (round {r})", flush=True)
            s = run_launcher(spec)
            rounds.add({"arm": arm, "repeat": r, "status": s.get("status"), "tokens_per_s": s.get("tokens_per_s"),
                        "sampler_status": s.get("sampler_status"), "sampler_samples": s.get("sampler_samples"),
                        "sampler_hz": s.get("sampler_hz")})


def overhead(rounds: pd.DataFrame) -> pd.DataFrame:
    """One row: mean tokens/s per arm, the ratio of the means, and mean ± 95% CI of the per-pair ratios."""
    arms = rounds.pivot(index="repeat", columns="arm", values="tokens_per_s").dropna()
    pair = (arms["on"] / arms["off"]) if len(arms) else pd.Series(dtype=float)
    ci = mean_ci(pair)
    return pd.DataFrame([{"pairs": len(pair), "tokens_per_s_on": arms["on"].mean() if len(arms) else None,
                          "tokens_per_s_off": arms["off"].mean() if len(arms) else None,
                          "ratio": arms["on"].mean() / arms["off"].mean() if len(arms) else None,
                          "pair_ratio_mean": ci.mean, "pair_ratio_ci95": ci.half_width}])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config-json", required=True, help="the study config (with its bench section) as JSON")
    ap.add_argument("--out-dir", required=True)
    a = ap.parse_args(argv)
    config, out = json.loads(a.config_json), Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    table = lambda df: overhead(df) if set(df["arm"]) == {"on", "off"} else pd.DataFrame()  # noqa: E731
    rounds = Rounds(out / "sampler_overhead_rounds.csv", config, table)
    run_pairs(config, out, rounds)
    rounds.write()
    print((out / "sampler_overhead.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
