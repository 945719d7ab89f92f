"""Each family's layout object (`SparkLayout`), by family name: what the offline tools
dispatch on. Each family's class names the same object (`layout`); contract.json names the
families and the operator names Spark records for them. Imports no live family.
"""
from __future__ import annotations

from .aggregate import LAYOUT as AGGREGATE
from .dedup import LAYOUT as DEDUPLICATE
from .dedup import is_dummy
from .flatmap import LAYOUT as FLATMAP
from .flatmap import is_group_state
from .layout import SparkLayout
from .session_window import LAYOUT as SESSION_WINDOW
from .transform_with_state import LAYOUT as TRANSFORM_WITH_STATE

LAYOUTS: dict[str, SparkLayout] = {layout.family: layout for layout in (
    DEDUPLICATE, AGGREGATE, SESSION_WINDOW, FLATMAP, TRANSFORM_WITH_STATE)}


def layout(family: str) -> SparkLayout:
    """The layout of `family` (a key of contract.json's `families`)."""
    try:
        return LAYOUTS[family]
    except KeyError:
        raise ValueError(f"arrowstate: no family {family!r} (families: "
                         f"{sorted(LAYOUTS)})") from None


def missing(registry: dict, layouts: dict[str, SparkLayout], declared: dict) -> list[str]:
    """What a family of `registry` (name -> family class) lacks: its layout object (the
    class's `layout`, registered in `layouts` under its name), an operation of SparkLayout
    the layout does not implement, its declaration in the contract (`declared`, with the
    operator names Spark records for it). Empty when every family has every part."""
    lacks = []
    for name, family in registry.items():
        own = getattr(family, "layout", None)
        if own is None or layouts.get(name) is not own or own.family != name:
            lacks.append(f"{name}: no layout object of its own registered under its name")
        elif type(own).__abstractmethods__:
            lacks.append(f"{name}: its layout does not implement "
                         f"{sorted(type(own).__abstractmethods__)}")
        if not declared.get(name, {}).get("sparkMetadataNames"):
            lacks.append(f"{name}: contract.json declares no sparkMetadataNames for it")
    return lacks + [f"{name}: a layout without a family" for name in set(layouts) - set(registry)]


def layout_of_schema(value_schema: dict, column_family: str | None = None) -> SparkLayout:
    """The one place a layout is chosen without the family's name: a READ_STATE or
    IMPORT_STATE request of the shim carries Spark's schemas only (Spark's state readers
    open the store provider with the schemas, and the conversions pass what the state schema
    file records). A column family is transformWithState's; Spark's value of plain
    deduplication is one `__dummy__` field; applyInPandasWithState's, a `groupState`
    struct. Any other value is the stored value columns field for field, as aggregation's,
    session windows' and deduplication within the watermark's alike: the aggregation
    layout stands for the three."""
    if column_family is not None:
        return TRANSFORM_WITH_STATE
    if is_dummy(value_schema):
        return DEDUPLICATE
    if is_group_state(value_schema):
        return FLATMAP
    return AGGREGATE
