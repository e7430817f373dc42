"""Long calls release the GIL and stop on Ctrl-C between batches."""

import _thread
import threading
import time

import pytest

import hyperlens as hl


def test_gil_is_released_during_latent_codes(model):
    ps = hl.tasks.sample(split="paper-seed0", set="ood", n=4000, seed=11)
    count = 0
    stop = threading.Event()

    def spin():
        nonlocal count
        while not stop.is_set():
            count += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    before = count
    t0 = time.perf_counter()
    model.latent_codes(ps, batch=64)
    dt = time.perf_counter() - t0
    during = count - before
    stop.set()
    t.join()
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
    count = 0
    stop = threading.Event()

    def spin():
        nonlocal count
        while not stop.is_set():
            count += 1

    t = threading.Thread(target=spin)
    t.start()
    timer = threading.Timer(1.5, _thread.interrupt_main)
    t0 = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        hl.train(tmp_path / "run", **opts)
    dt = time.perf_counter() - t0
    timer.cancel()
    stop.set()
    t.join()
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
    count = 0
    stop = threading.Event()

    def spin():
        nonlocal count
        while not stop.is_set():
            count += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    before = count
    t0 = time.perf_counter()
    logic.latent_codes(ps, batch=64)
    dt = time.perf_counter() - t0
    during = count - before
    stop.set()
    t.join()
    assert during > max(1000, 20_000 * dt), (during, dt)
