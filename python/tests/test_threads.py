"""Long calls release the GIL and stop on Ctrl-C between batches."""

import _thread
import threading
import time

import numpy as np
import pytest

import hyperlens as hl


class _Spinner:
    """A second Python thread that counts as fast as it can while the ``with`` block runs: a call
    that holds the GIL leaves ``count`` almost where it was, one that releases it does not."""

    def __enter__(self):
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin)
        self._thread.start()
        return self

    def _spin(self):
        while not self._stop.is_set():
            self.count += 1

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _spins_during(fn):
    """``(increments of the other thread during fn(), seconds of fn())``."""
    with _Spinner() as spinner:
        time.sleep(0.05)
        before = spinner.count
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        during = spinner.count - before
    return during, dt


def test_gil_is_released_during_latent_codes(model):
    ps = hl.tasks.sample(split="paper-seed0", set="ood", n=4000, seed=11)
    during, dt = _spins_during(lambda: model.latent_codes(ps, batch=64))
    # A call that held the GIL throughout would leave the counter where it was (the other thread
    # could only run at the interpreter's switch interval, before the call); released, the other
    # thread spins freely, hundreds of thousands of increments per second.
    assert during > max(1000, 20_000 * dt), (during, dt)


def _long_set(model, seed):
    """A problem set that takes several seconds at batch 8, however fast the machine."""
    probe = hl.tasks.sample(split="paper-seed0", set="ood", n=400, seed=seed)
    t0 = time.perf_counter()
    model.latent_codes(probe, batch=8)
    per_problem = (time.perf_counter() - t0) / 400
    n = int(min(300_000, max(20_000, 4.0 / per_problem)))
    return hl.tasks.sample(split="paper-seed0", set="ood", n=n, seed=seed), per_problem * n


@pytest.mark.parametrize("call", ["latent_codes", "evaluate", "logits"])
def test_keyboard_interrupt_stops_a_long_call(model, call):
    ps, expected = _long_set(model, 12)
    fn = getattr(model, call)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        fn(ps, batch=8)
    elapsed = time.perf_counter() - t0
    timer.cancel()
    assert elapsed < 0.5 * expected + 0.5, (elapsed, expected)


def test_train_releases_the_gil_and_ctrl_c_leaves_a_resumable_run(tmp_path):
    """hl.train runs its updates without the GIL, and Ctrl-C (SIGINT's flag, as interrupt_main
    sets it) stops it at the end of an update with a checkpoint that resume continues."""
    opts = dict(task="sraven", split="paper-seed0", steps=100_000, batch=32, layers=2, d_model=16, heads=2,
                d_head=8, d_mlp=16, eval_n=64, eval_every=0, checkpoint_every=0, progress=False)
    with _Spinner() as spinner:
        timer = threading.Timer(1.5, _thread.interrupt_main)
        t0 = time.perf_counter()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            hl.train(tmp_path / "run", **opts)
        dt = time.perf_counter() - t0
        timer.cancel()
    count = spinner.count
    assert dt < 30, dt  # 100,000 updates would take far longer: the run stopped
    assert count > 20_000 * dt, (count, dt)
    import json

    step = json.loads((tmp_path / "run" / "train_state.json").read_text())["step"]
    assert 0 < step < 100_000
    # resume continues from that step (stopped again three updates later)
    first = []
    r = hl.train(tmp_path / "run", resume=True, progress=lambda e: first.append(e["step"]) if e["event"] == "start" else e["event"] == "step" and e["step"] >= step + 2)
    assert first == [step] and not r.completed and r.step == step + 3


def test_gil_is_released_during_logic_latent_codes():
    logic = hl.load("logic-hyla")
    ps = hl.tasks.sample("logic", set="ood", n=3000, seed=1)
    during, dt = _spins_during(lambda: logic.latent_codes(ps, batch=64))
    assert during > max(1000, 20_000 * dt), (during, dt)


def _interrupted_within(fn, expected):
    """Runs ``fn()`` with Ctrl-C (SIGINT's flag, as interrupt_main sets it) 0.3 s in; asserts
    that it raised ``KeyboardInterrupt`` well before the ``expected`` seconds of the whole call."""
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        fn()
    elapsed = time.perf_counter() - t0
    timer.cancel()
    assert elapsed < 0.5 * expected + 0.5, (elapsed, expected)


def _scaled(per_unit: float, seconds: float = 6.0, lo: int = 32, hi: int = 20_000) -> int:
    """How many units (problems) take about ``seconds``, however fast the machine."""
    return int(min(hi, max(lo, seconds / per_unit)))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_keyboard_interrupt_stops_activation_patching(model):
    # hundreds of forward passes per batch, whatever its size: one batch of one problem calibrates
    small = hl.tasks.sample(split="paper-seed0", set="ood", n=2, seed=21, unpermuted=True)
    per = _timed(lambda: hl.patching.activation_patching(model, small, batch=1)) / 2
    n = _scaled(per, lo=4)
    big = hl.tasks.sample(split="paper-seed0", set="ood", n=n, seed=21, unpermuted=True)
    _interrupted_within(lambda: hl.patching.activation_patching(model, big, batch=1), per * n)


def test_keyboard_interrupt_stops_direct_logit_attribution(model):
    small = hl.tasks.sample(split="paper-seed0", set="ood", n=64, seed=22)
    per = _timed(lambda: hl.patching.direct_logit_attribution(model, small, batch=8)) / 64
    n = _scaled(per, hi=200_000)
    big = hl.tasks.sample(split="paper-seed0", set="ood", n=n, seed=22)
    _interrupted_within(lambda: hl.patching.direct_logit_attribution(model, big, batch=8), per * n)


def test_keyboard_interrupt_stops_the_transplant(model):
    def sets(n):
        return tuple(
            hl.tasks.sample(split="paper-seed0", set=s, n=n, seed=23, unpermuted=True) for s in ("id", "ood")
        )

    small = sets(32)
    per = _timed(lambda: hl.patching.latent_transplant(model, *small, batch=8)) / 32
    n = _scaled(per)
    big = sets(n)
    _interrupted_within(lambda: hl.patching.latent_transplant(model, *big, batch=8), per * n)


def test_keyboard_interrupt_stops_the_analysis(model):
    def codes(n):
        return tuple(
            model.latent_codes(hl.tasks.sample(split="paper-seed0", set=s, n=n, seed=24)) for s in ("id", "ood")
        )

    small = codes(512)
    expected = _timed(lambda: hl.analysis.analyze(*small))
    # the analysis grows at least linearly with N (k-means, the silhouette grow faster): the codes
    # repeated `reps` times take at least `reps` times as long, sized so that the whole call would
    # take about 6 s however fast the machine (2,048 codes took under the 0.3 s before Ctrl-C on a
    # quiet machine, and the call ended before the signal)
    reps = _scaled(expected / 512, lo=512 * 4, hi=512 * 64) // 512

    def repeated(c):
        return hl.CodeSet(**{k: np.concatenate([v] * reps) for k, v in c.as_dict().items()})

    big = tuple(repeated(c) for c in small)
    _interrupted_within(lambda: hl.analysis.analyze(*big), reps * expected)


def test_ctrl_c_or_a_failing_callback_stops_the_report_and_leaves_no_files(tmp_path):
    """Ctrl-C during the report, or an exception of its progress callback, stops it at that step:
    the stages after it never start, the staging directory is removed and `out` is as it was."""
    out = tmp_path / "report"
    out.mkdir()
    stages = []

    def record(e):
        stages.append(e["stage"])

    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        hl.report(out, checkpoints=["data/checkpoints/sraven-hyla"], n=4096, progress=record)
    timer.cancel()
    assert stages[0] == "checkpoint" and "analysis" not in stages and "figures" not in stages, stages
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["report"]

    class Stop(Exception):
        pass

    def fail_on_transplant(e):
        stages.append(e["stage"])
        if e["stage"] == "causal":
            raise Stop

    stages.clear()
    with pytest.raises(Stop):
        hl.report(out, checkpoints=["data/checkpoints/sraven-hyla"], n=64, causal_n=16, progress=fail_on_transplant)
    assert stages.count("causal") == 1 and "analysis" not in stages and "figures" not in stages, stages
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["report"]
