"""The progress bar of a run (on stderr), and its closing table (on stdout)."""

from __future__ import annotations

import math
import sys

from tqdm.auto import tqdm


class Progress:
    def __init__(self, enabled: bool = True, desc: str = ""):
        self.enabled, self.desc = enabled, desc
        self.bar: tqdm | None = None
        self.last: dict[str, float] = {}

    def start(self, total: int, done: int) -> None:
        if self.enabled:
            self.bar = tqdm(
                total=total,
                initial=done,
                desc=self.desc,
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=True,  # the final line stays (in a terminal and in Jupyter)
            )

    def update(self, steps: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.n = steps
            post = {"loss": f"{loss:.3f}"}
            if self.last:
                post["epoch"] = f"{self.last['epoch']:.2f}"
                if "test_perplexity" in self.last:
                    post["test_ppl"] = f"{self.last['test_perplexity']:.2f}"
                else:
                    post["test_err"] = f"{100 * self.last['test_error']:.2f}%"
            self.bar.set_postfix(post, refresh=False)
            self.bar.refresh()

    def row(self, row: dict[str, float]) -> None:
        self.last = row

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_table(rows: list[dict[str, float]]) -> str:
    """A short table of the evaluations: epoch, train loss, test loss, test error (and
    a language model's test perplexity), gap."""
    ppl = bool(rows) and "test_perplexity" in rows[0]
    head = f"{'epoch':>7} {'updates':>8} {'train_loss':>10} {'test_loss':>9} {'test_err':>8}"
    head += f" {'test_ppl':>9}" * ppl + f" {'gap':>10} {'stale':>6}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['epoch']:7.2f} {int(r['updates']):8d} {_f(r['train_loss'], '10.4f')} "
            f"{_f(r['test_loss'], '9.4f')} {_f(100 * r['test_error'], '7.2f')}% "
            + (f"{_f(r['test_perplexity'], '9.3f')} " if ppl else "")
            + f"{_f(r['mean_gap'], '10.3g')} {_f(r['mean_staleness'], '6.1f')}"
        )
    return "\n".join(lines)


def _f(value: float, spec: str) -> str:
    width = int(spec.split(".")[0])
    return format(value, spec) if math.isfinite(value) else "-".rjust(width)
