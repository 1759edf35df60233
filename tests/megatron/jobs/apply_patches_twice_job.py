"""Calls megatron_patches.apply() twice in a fresh interpreter; writes what each call did as JSON to argv[1].

Run as a plain subprocess by tests/megatron/test_megatron_patches.py, so that the test process itself stays
unpatched. Reports: the names each call returned, which module/class attributes the second call changed
(must be none), and a few probes of patched and deliberately unpatched behaviour.
"""

import inspect
import json
import sys

import torch


def megatron_namespaces():
    """Every attribute of every loaded megatron module and of every class defined in one, by identity."""
    snapshot = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("megatron.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            snapshot[(module_name, attr)] = id(value)
            if inspect.isclass(value) and value.__module__ == module_name:
                for class_attr, class_value in list(vars(value).items()):
                    snapshot[(f"{module_name}.{attr}", class_attr)] = id(class_value)
    for attr, value in vars(torch.cuda).items():
        snapshot[("torch.cuda", attr)] = id(value)
    return snapshot


def probe(call):
    try:
        return repr(call())
    except Exception as error:  # the probe records failures; the test decides which are expected
        return f"{type(error).__name__}: {error}"


def main():
    import megatron_patches

    first = megatron_patches.apply()
    before = megatron_namespaces()
    second = megatron_patches.apply()
    after = megatron_namespaces()
    changed = sorted(
        f"{owner}.{attr}"
        for owner, attr in set(before) | set(after)
        if before.get((owner, attr)) != after.get((owner, attr))
    )

    from megatron.core.transformer import utils as transformer_utils

    report = {
        "first": first,
        "second": second,
        "changed_by_second_call": changed,
        "cuda_available": torch.cuda.is_available(),
        "probes": {
            "current_device": probe(lambda: torch.cuda.current_device()),
            "causal_mask_device": probe(lambda: transformer_utils.get_default_causal_mask(4).device.type),
            # Outside the patched Megatron modules torch must be untouched:
            "plain_torch_cuda_factory": probe(lambda: torch.zeros(1, device="cuda")),
            "tensor_type_outside_megatron": probe(lambda: torch.zeros(1).type()),
        },
    }
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
