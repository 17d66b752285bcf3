"""provenance/scope.py's ModuleScope, the one module tracker: the Tracer hooks its model's modules,
prediction hooks every module (torch's global hooks); both name a module by its path in the model,
pop it even when its forward raises, and see the model's own inputs once per outer call."""
import pytest
import torch

from amem_alloc.provenance.scope import ModuleScope


class Block(torch.nn.Module):
    def __init__(self, seen, scope):
        super().__init__()
        self.lin, self.seen, self.scope = torch.nn.Linear(2, 2), seen, scope

    def forward(self, x):
        self.seen.append((self.scope[0].module, list(self.scope[0].stack)))
        return self.lin(x)


def model_and_log():
    seen, holder = [], [None]
    model = torch.nn.Sequential(Block(seen, holder), torch.nn.Sequential(Block(seen, holder)))
    return model, seen, holder


@pytest.mark.parametrize("every", [False, True])
def test_the_module_running_now_is_named_by_its_path(every):
    model, seen, holder = model_and_log()
    inputs = []
    scope = ModuleScope.every_module() if every else ModuleScope(model, inputs.append)
    holder[0] = scope
    scope.install()
    try:
        x = torch.ones(1, 2)
        model(x)
    finally:
        scope.remove()
    assert seen == [("0", ["", "0"]), ("1.0", ["", "1", "1.0"])]
    assert scope.module is None and scope.stack == [] and scope.autocast == []
    if every:
        assert scope.roots == [model]
    else:
        assert len(inputs) == 1 and inputs[0][0] is x  # the model's own input, once
    model(torch.ones(1, 2))  # removed: nothing is tracked any more
    assert scope.stack == [] and len(seen) == 4 and seen[-1] == (None, [])


def test_an_exception_in_forward_leaves_the_stack_empty():
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Boom())
    scope = ModuleScope.every_module()
    scope.install()
    try:
        with pytest.raises(RuntimeError, match="boom"):
            model(torch.ones(1, 2))
        assert scope.stack == []
    finally:
        scope.remove()


def test_autocast_is_recorded_per_module():
    model = torch.nn.Linear(2, 2)
    states = []
    model.register_forward_hook(lambda m, a, o: states.append(scope.autocast_on))
    scope = ModuleScope(model, lambda tensors: None)
    scope.install()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.ones(1, 2))
        model(torch.ones(1, 2))
    finally:
        scope.remove()
    assert states == [True, False]


def test_a_submodule_run_before_its_model_is_named_from_the_model_once_the_model_runs():
    """LLaVA runs its vision tower (get_image_features) before the model's forward: the tower was
    a root, and its modules kept paths relative to it ("1.0" instead of the model's "1.1.0")
    after the model ran."""
    model, seen, holder = model_and_log()
    scope = holder[0] = ModuleScope.every_module()
    scope.install()
    try:
        x = torch.ones(1, 2)
        model[1](x)   # the inner Sequential alone: a root
        assert [m for m in scope.roots] == [model[1]]
        model(x)
        model[1](x)   # alone again, after the model ran
    finally:
        scope.remove()
    assert [name for name, _ in seen] == ["0", "0", "1.0", "1.0"]
    assert [m for m in scope.roots] == [model]
