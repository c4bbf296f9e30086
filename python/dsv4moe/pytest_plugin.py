"""pytest plugin (entry point ``pytest11``): an engine's MoE layer over exported dsv4moe cases.

    pip install ./python          # from a dsv4moe checkout: the library, the CLI, this plugin
    pytest --dsv4moe-cases D --dsv4moe-engine mypkg.moe:run [--dsv4moe-rounding bf16_ops]

D is a folder of ``dsv4moe export``. Each case becomes one test, ``dsv4moe/<case id>``; it calls the
engine function with the case (a ``dsv4moe.testing.Case``: ``x``, ``input_ids``, ``config``,
``model_path``, ``weights()``, ...) and holds what it returns against the reference with
``Case.check`` (SPEC.md section 10), the verdict line being the failure message. The function returns
y ([T, H], any float array or torch tensor), or (y, topk_ids, topk_weights), or a dict with y and
optionally topk_ids, topk_weights and rounding (its own profile for that case).

The rounding profile: the dict's ``rounding``, else ``--dsv4moe-rounding``, else the function's
attribute ``dsv4moe_rounding``, else ``spec``. Other options: ``--dsv4moe-sentinel`` (E, -1,
absent), ``--dsv4moe-fp8`` (the engine accumulates on FP8 tensor cores), ``--dsv4moe-outputs O``
(also write each output as O/<case id>/output.safetensors for ``dsv4moe check``).
"""
import importlib
import os
import sys

import pytest

from . import testing


def pytest_addoption(parser):
    g = parser.getgroup("dsv4moe", "an engine's DeepSeek-V4 MoE layer against exported dsv4moe cases")
    g.addoption("--dsv4moe-cases", metavar="D", default=None,
                help="a folder of `dsv4moe export`: one test per case")
    g.addoption("--dsv4moe-engine", metavar="MODULE:FUNCTION", default=None,
                help="the engine function, called with each case (importable; the current folder is on the path)")
    g.addoption("--dsv4moe-rounding", metavar="P", default=None, choices=testing.ROUNDINGS,
                help="the engine's rounding profile (SPEC.md section 10): spec, bf16_ops or fp32")
    g.addoption("--dsv4moe-sentinel", metavar="S", default="E", choices=["E", "-1", "absent"],
                help="how the engine marks a pruned top-p slot in topk_ids")
    g.addoption("--dsv4moe-fp8", action="store_true", default=False,
                help="the engine accumulates on FP8 tensor cores (rule outside-fp8-mma)")
    g.addoption("--dsv4moe-outputs", metavar="O", default=None,
                help="also write each output as O/<case id>/output.safetensors (for dsv4moe check)")


def _engine(spec):
    mod, sep, fn = spec.partition(":")
    if not sep or not mod or not fn:
        raise pytest.UsageError("--dsv4moe-engine %r: expected MODULE:FUNCTION" % spec)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(mod)
    except Exception as e:  # the engine's own import error, named
        raise pytest.UsageError("--dsv4moe-engine %s: cannot import %s: %r" % (spec, mod, e))
    for part in fn.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise pytest.UsageError("--dsv4moe-engine %s: %s has no callable %s" % (spec, mod, fn))
    return obj


class CaseItem(pytest.Item):
    def __init__(self, *, case, engine, opts, **kw):
        super().__init__(**kw)
        self.case, self.engine, self.opts = case, engine, opts

    def runtest(self):
        out = self.engine(self.case)
        ids = w = None
        rounding = self.opts["rounding"]
        if isinstance(out, dict):
            if "y" not in out:
                raise testing.CaseError("%s: the engine's dict has no 'y'" % self.case.id)
            y, ids, w = out["y"], out.get("topk_ids"), out.get("topk_weights")
            rounding = out.get("rounding", rounding)
        elif isinstance(out, (tuple, list)):
            if len(out) != 3:
                raise testing.CaseError("%s: the engine returned %d values; y or (y, topk_ids, topk_weights)"
                                        % (self.case.id, len(out)))
            y, ids, w = out
        else:
            y = out
        if self.opts["outputs"]:
            self.case.write_output(self.opts["outputs"], testing.to_bf16_bits(testing._np(y)), ids, w,
                                   engine=self.opts["name"], rounding=rounding)
        self.case.check(y, topk_ids=ids, topk_weights=w, sentinel=self.opts["sentinel"], fp8=self.opts["fp8"],
                        rounding=rounding)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, (testing.CheckFailed, testing.CaseError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.case.dir, None, "dsv4moe case %s" % self.case.id


class CasesCollector(pytest.Collector):
    def __init__(self, *, cases, engine, opts, **kw):
        super().__init__(**kw)
        self._cases, self._engine, self._opts = cases, engine, opts

    def collect(self):
        for c in self._cases:
            yield CaseItem.from_parent(self, name=c.id, nodeid="dsv4moe/" + c.id, case=c, engine=self._engine,
                                       opts=self._opts)


def pytest_collection_modifyitems(session, config, items):
    d = config.getoption("dsv4moe_cases")
    spec = config.getoption("dsv4moe_engine")
    if not d and not spec:
        return
    if not d or not spec:
        raise pytest.UsageError("--dsv4moe-cases D and --dsv4moe-engine MODULE:FUNCTION go together")
    try:
        cases = testing.cases(d)
    except testing.CaseError as e:
        raise pytest.UsageError("--dsv4moe-cases: %s" % e)
    fn = _engine(spec)
    opts = {"rounding": config.getoption("dsv4moe_rounding") or getattr(fn, "dsv4moe_rounding", "spec"),
            "sentinel": config.getoption("dsv4moe_sentinel"), "fp8": config.getoption("dsv4moe_fp8"),
            "outputs": config.getoption("dsv4moe_outputs"), "name": spec}
    if opts["rounding"] not in testing.ROUNDINGS:
        raise pytest.UsageError("%s: dsv4moe_rounding %r is not one of %s"
                                % (spec, opts["rounding"], ", ".join(testing.ROUNDINGS)))
    col = CasesCollector.from_parent(session, name="dsv4moe", nodeid="dsv4moe", cases=cases, engine=fn, opts=opts)
    items.extend(col.collect())
