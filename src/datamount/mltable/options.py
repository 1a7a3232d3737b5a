"""The typed options of MLTable transformations (pydantic models): the read
steps, `take_random_sample`, `convert_column_types` items and the
`infer_column_types` object; and their parsers. Pure; used by model.py.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Encoding = Literal[
    "utf8", "utf-8", "iso88591", "iso-8859-1", "latin1", "latin-1", "ascii", "utf16", "utf-16",
    "utf32", "utf8bom", "utf8 bom", "windows1252", "windows-1252",
]  # fmt: skip
# MLTable encoding names (Azure ML's spellings, and utf32/utf8bom) → Python codecs.
CODECS = {
    "utf8": "utf-8",
    "utf-8": "utf-8",
    "iso88591": "iso-8859-1",
    "iso-8859-1": "iso-8859-1",
    "latin1": "latin-1",
    "latin-1": "latin-1",
    "ascii": "ascii",
    "utf16": "utf-16",
    "utf-16": "utf-16",
    "utf32": "utf-32",
    "utf8bom": "utf-8-sig",
    "utf8 bom": "utf-8-sig",
    "windows1252": "cp1252",
    "windows-1252": "cp1252",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReadDelimited(_Strict):
    delimiter: str = ","
    header: Literal[
        "all_files_same_headers", "from_first_file", "all_files_different_headers", "no_header"
    ] = "all_files_same_headers"
    encoding: Encoding = "utf8"
    empty_as_string: bool = False
    include_path_column: bool = False
    path_column: str = "Path"
    support_multi_line: bool = False
    infer_column_types: bool | InferTypes = True
    partition_size: int | None = None  # the SDK writes it: Azure ML's parallelism hint, unused

    @property
    def overrides(self) -> list[Conversion]:
        """The column_type_overrides of an `infer_column_types` object."""
        it = self.infer_column_types
        return list(it.column_type_overrides) if isinstance(it, InferTypes) else []

    @field_validator("infer_column_types", mode="before")
    @classmethod
    def _infer(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        try:  # the object's own message, not the union's "should be a valid boolean"
            return InferTypes.model_validate(v)
        except ValidationError as exc:
            raise ValueError(pydantic_message(exc)) from None

    @field_validator("delimiter")
    @classmethod
    def _one_char(cls, v: str) -> str:
        if len(v) != 1:
            raise ValueError(f"delimiter must be one character, got {v!r}")
        return v


class ReadParquet(_Strict):
    include_path_column: bool = False
    path_column: str = "Path"


RFC3339 = re.compile(
    r"^\d{4}-(0[1-9]|1[0-2])-[0-3]\d[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?$"
)


class ReadDeltaLake(_Strict):
    """`read_delta_lake` (the SDK's `from_delta_lake`): the table at its paths
    entry's folder, as of a version or an RFC 3339 timestamp (at most one)."""

    version_as_of: int | None = Field(default=None, ge=0)
    timestamp_as_of: str | None = None
    include_path_column: bool = False
    path_column: str = "Path"

    @field_validator("timestamp_as_of")
    @classmethod
    def _rfc3339(cls, v: str | None) -> str | None:
        if v is not None and not RFC3339.match(v):
            raise ValueError(f"timestamp_as_of {v!r}: expected RFC 3339, e.g. 2024-01-01T00:00:00Z")
        return v

    @model_validator(mode="after")
    def _one_of(self) -> ReadDeltaLake:
        if self.version_as_of is not None and self.timestamp_as_of is not None:
            raise ValueError("give version_as_of or timestamp_as_of, not both")
        return self


class ReadJsonLines(_Strict):
    encoding: Encoding = "utf8"
    invalid_lines: Literal["error", "drop"] = "error"
    include_path_column: bool = False
    path_column: str = "Path"
    partition_size: int | None = None  # the SDK writes it: Azure ML's parallelism hint, unused


class TakeRandomSample(_Strict):
    probability: float = Field(ge=0.0, le=1.0)
    seed: int | None = None


class SamplerArguments(_Strict):
    probability: float = Field(ge=0.0, le=1.0)
    probability_lower_bound: float = Field(ge=0.0, le=1.0)  # required, as by Azure ML's runtime
    seed: int | None = None


class Sample(_Strict):
    """The `sample` transformation (Azure ML's schema): row i is kept when the
    i-th draw lies in [probability_lower_bound, probability)."""

    sampler: Literal["random_percent", "randomPercent"]
    sampler_arguments: SamplerArguments


class DatetimeType(_Strict):
    formats: list[str] = Field(default_factory=list)
    date_constant: str | None = None

    @field_validator("formats", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class BooleanType(_Strict):
    true_values: list[str] = Field(default_factory=lambda: ["true", "True", "TRUE", "1"])
    false_values: list[str] = Field(default_factory=lambda: ["false", "False", "FALSE", "0"])
    mismatch_as: Literal["true", "false", "error"] | None = None


ColumnType = Literal["int", "float", "string", "boolean", "datetime"]


class Conversion(_Strict):
    """One `convert_column_types` item: `columns` (a name or a list) to `column_type`."""

    columns: list[str]
    column_type: ColumnType
    datetime: DatetimeType | None = None
    boolean: BooleanType | None = None


def pydantic_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown key {loc!r}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def columns(value: Any) -> list[str]:
    cols = [value] if isinstance(value, str) else value
    if not isinstance(cols, list) or not cols or not all(isinstance(c, str) for c in cols):
        raise ValueError(f"expected a column name or a list of column names, got {value!r}")
    if len(set(cols)) != len(cols):
        raise ValueError(f"duplicate column in {cols!r}")
    return list(cols)


def conversions(value: Any) -> list[Conversion]:
    items = value if isinstance(value, list) else [value]
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"[{i}]: expected a mapping with columns and column_type")
        unknown = sorted(set(item) - {"columns", "column_type"})
        if unknown:
            raise ValueError(f"[{i}]: unknown key {unknown[0]!r}")
        if "columns" not in item or "column_type" not in item:
            raise ValueError(f"[{i}]: needs both columns and column_type")
        try:
            names = columns(item["columns"])
        except ValueError as exc:
            raise ValueError(f"[{i}].columns: {exc}") from None
        ctype = item["column_type"]
        fields: dict[str, Any] = {"columns": names}
        if isinstance(ctype, dict) and len(ctype) == 1:
            ((kind, opts),) = ctype.items()
            if kind not in ("datetime", "boolean"):
                raise ValueError(
                    f"[{i}].column_type: only datetime and boolean take options, not {kind!r}"
                )
            fields.update(column_type=kind, **{kind: opts or {}})
        elif isinstance(ctype, str):
            fields["column_type"] = ctype
        else:
            raise ValueError(f"[{i}].column_type: expected a type name or one-key mapping")
        try:
            conv = Conversion.model_validate(fields)
        except ValidationError as exc:
            raise ValueError(f"[{i}].{pydantic_message(exc)}") from None
        if conv.column_type == "datetime" and conv.datetime is None:
            conv = conv.model_copy(update={"datetime": DatetimeType()})
        if conv.column_type == "boolean" and conv.boolean is None:
            conv = conv.model_copy(update={"boolean": BooleanType()})
        out.append(conv)
    return out


class InferTypes(_Strict):
    """`infer_column_types` as an object (the SDK writes it): types inferred,
    except the override columns, read as text and converted to their type
    (never inferred first: `00501` stays whole). `sample_size` is accepted;
    datamount infers from each block it reads."""

    sample_size: int | None = None
    column_type_overrides: list[Conversion] = Field(default_factory=list)

    @field_validator("column_type_overrides", mode="before")
    @classmethod
    def _parse(cls, v: Any) -> Any:
        return [] if v is None else conversions(v)


ReadDelimited.model_rebuild()
