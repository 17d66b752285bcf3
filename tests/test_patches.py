"""One patch set (amem_alloc/patching.py): every change amem makes to torch or another library is
declared, applied through a PatchSet and undone — checked here on real predictions (a training step
with autocast, pinning, initializers and torch.compile; what-ifs; a distributed job with DDP and
FSDP; a script that raises): after each, every attribute a patch touched is what it was before,
and the table docs/predict.md shows is the catalogue of every declaration."""
from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

import amem_alloc
from amem_alloc import patching

torch = pytest.importorskip("torch")
HERE = Path(__file__).resolve().parent


@pytest.fixture
def applied(monkeypatch):
    """Every change any PatchSet made while the test ran: (declaration, owner, name, what was there)."""
    log: list = []
    apply, setenv = patching.PatchSet.apply, patching.PatchSet.setenv

    def logging_apply(self, patch, obj, name, replacement):
        out = apply(self, patch, obj, name, replacement)
        log.append(self.applied[-1])
        return out

    def logging_setenv(self, patch, name, value):
        setenv(self, patch, name, value)
        log.append(self.applied[-1])

    monkeypatch.setattr(patching.PatchSet, "apply", logging_apply)
    monkeypatch.setattr(patching.PatchSet, "setenv", logging_setenv)
    return log


def _concrete() -> dict:
    """Each declared attribute that can be found by its owner's dotted path: its object's own value
    (every declaring module imported first, so the catalogue is whole, and every owner imported
    before any value is read: importing one may change another's, as Lightning Fabric's
    wrappers.py replaces torch.compile)."""
    from amem_alloc.predict import patch_table

    patch_table.markdown()
    owners = {}
    for p in patching.CATALOGUE:
        for owner in p.owner.split(", "):
            if owner != "os.environ":
                owners.setdefault(owner, _owner(owner))
    out = {}
    for p in patching.CATALOGUE:
        for owner in p.owner.split(", "):
            obj = owners.get(owner)
            if obj is not None and p.attribute.isidentifier():
                own = getattr(obj, "__dict__", {})
                out[(owner, p.attribute)] = own.get(p.attribute, "<absent>") if hasattr(own, "get") else None
    return out


def _owner(owner: str):
    """The module or class a dotted path names, or None where it cannot be found."""
    try:
        return importlib.import_module(owner)
    except ImportError:
        module, _, name = owner.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return None


def _train_step():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    torch.nn.init.trunc_normal_(model[0].weight)
    opt = torch.optim.AdamW(model.parameters())
    compiled = torch.compile(model)
    x = torch.randn(16, 64).pin_memory().cuda(non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = compiled(x).float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)


def test_a_prediction_puts_back_everything_it_changed(applied):
    before = _concrete()
    amem_alloc.predict(_train_step, gpu="H100", what_if="grads=set-to-none,optimizer=fused")
    assert applied, "the prediction made no patch: the test does not see them"
    assert patching.still_patched(applied) == []
    assert _concrete() == before


def test_a_prediction_that_raises_puts_back_everything_too(applied):
    before = _concrete()

    def broken():
        torch.nn.Linear(4, 4).cuda()(torch.randn(2, 4, device="cuda"))
        raise KeyError("the user's own error")

    with pytest.raises(KeyError, match="the user's own error"):
        amem_alloc.predict(broken, gpu="H100")
    assert applied and patching.still_patched(applied) == []
    assert _concrete() == before


def test_a_distributed_prediction_puts_back_everything(applied):
    from amem_alloc.predict.distributed import launch as launch_mod
    from amem_alloc.predict.distributed.ranks import predict_ranks

    before = _concrete()
    for script in ("dist_ddp.py", "dist_fsdp2.py", "dist_collectives.py"):
        predict_ranks(launch_mod.Launch(2, 1, (0, 1)), [str(HERE / "predict_models" / script)], "H100", "torch",
                      steps=2, timeout=300, workers=1)
    declared = {p.owner for p, *_ in applied}
    assert {"torch.distributed, torch.distributed.distributed_c10d", "os.environ"} <= declared, declared
    assert patching.still_patched(applied) == []
    assert _concrete() == before   # (the environment variables set are among `applied`)


def test_an_undeclared_patch_is_refused():
    class Owner:
        x = 1

    with patching.PatchSet() as patches:
        with pytest.raises(AssertionError, match="undeclared"):
            patches.apply(patching.Patch("Owner", "x", "no reason", "nobody"), Owner, "x", 2)
    assert Owner.x == 1


def test_inherited_and_absent_attributes_are_removed_again_not_copied():
    class Base:
        def f(self):
            return "base"

    class Child(Base):
        pass

    patch = patching.declare("a test class", "f, g", "test")
    try:
        with patching.PatchSet() as patches:
            patches.apply(patch, Child, "f", lambda self: "patched")
            patches.apply(patch, Child, "g", 5)
            instance = Child()
            patches.apply(patch, instance, "f", lambda: "instance")
            assert (Child().f(), Child.g, instance.f()) == ("patched", 5, "instance")
    finally:
        patching.CATALOGUE.remove(patch)   # not one of amem's: kept out of the docs' table
    assert "f" not in vars(Child) and not hasattr(Child, "g") and "f" not in vars(instance)
    assert instance.f() == "base"


def _every_module() -> list[str]:
    root = Path(amem_alloc.__file__).parent
    names = ["amem_alloc.torch_patch"]
    for info in pkgutil.walk_packages([str(root / "predict")], "amem_alloc.predict."):
        names.append(info.name)
    return names


def test_docs_show_the_table_of_every_patch():
    for name in _every_module():
        importlib.import_module(name)
    from amem_alloc.predict import patch_table

    page = (HERE.parent / "docs" / "predict.md").read_text(encoding="utf-8")
    assert patch_table.markdown() in page, "docs/predict.md's patch table is not the catalogue's: " \
                                           "python -m amem_alloc.predict.patch_table prints it"
    assert len(patching.CATALOGUE) >= 100
    owners = {p.owner for p in patching.CATALOGUE}
    assert {"torch.cuda", "torch.Tensor", "torch.nn.Parameter", "os.environ"} <= owners
    assert sys.modules.get("amem_alloc.predict.engine.torch_patches") is not None


@pytest.fixture
def declared():
    """A declaration for this test only (kept out of the catalogue the docs show)."""
    patch = patching.declare("the process's audit events", "amem.test", "a test of PatchSet.listen")
    yield patch
    patching.CATALOGUE.remove(patch)


def test_the_innermost_listener_hears_an_audit_event_until_its_patch_set_closes(declared):
    heard = []

    def failing(event, args):
        heard.append(("failing", args))
        raise RuntimeError("a listener's failure must not reach the program")

    with patching.PatchSet() as outer:
        outer.listen(declared, ("amem.test",), lambda event, args: heard.append(("outer", args)))
        sys.audit("amem.test", 1)
        with patching.PatchSet() as inner:
            inner.listen(declared, ("amem.test",), failing)
            sys.audit("amem.test", 2)
            sys.audit("amem.other", 3)
        sys.audit("amem.test", 4)
    sys.audit("amem.test", 5)
    assert heard == [("outer", (1,)), ("failing", (2,)), ("outer", (4,))]
    with pytest.raises(AssertionError, match="undeclared"):
        with patching.PatchSet() as patches:
            patches.listen(patching.Patch("x", "y", "z", "nobody"), ("amem.test",), print)
