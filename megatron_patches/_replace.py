"""The one way a patch in this package replaces an attribute: marked, so apply() can tell it already ran.

The marker lives on the replacement object itself (not in a module-level set), so it survives a reload of
this package and a second apply() from another copy of it in the same process still changes nothing.
"""

from typing import Any

MARKER = "__megatron_patches__"


def replace(owner: Any, attr: str, replacement: Any, patch_name: str) -> None:
    """Sets owner.attr = replacement, tagging the replacement with the patch that installed it."""
    if isinstance(replacement, (classmethod, staticmethod)):  # getattr on the owner yields the inner function
        setattr(replacement.__func__, MARKER, patch_name)
    else:
        setattr(replacement, MARKER, patch_name)
    setattr(owner, attr, replacement)


def replaced_by(owner: Any, attr: str, patch_name: str) -> bool:
    """Whether owner.attr is a replacement that the patch `patch_name` installed."""
    return getattr(getattr(owner, attr, None), MARKER, None) == patch_name
