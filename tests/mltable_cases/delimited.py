"""Oracle cases for delimited text: one file read under each option set,
delimiters, encodings, several files and their headers."""

from __future__ import annotations

from mltable_cases.base import Case, file_entry, table_text

# -- delimited text: one file, read with each option set ------------------------

PEOPLE = (
    b"id,name,score,flag,day\n"
    b"1,ann,1.5,true,2024-01-01\n"
    b"2,bob,2.5,false,2024-01-08\n"
    b"3,,3.0,true,2024-02-03\n"
    b"4,dee,,false,2024-03-04\n"
)

CSV_DATA: dict[str, bytes] = {
    "basic": b"a,b,c\n1,x,1.5\n2,y,2.5\n",
    "people": PEOPLE,
    "text_like": b"zip,price,flag,sci,day,m\n00501,1.50,TRUE,1e3,2024-01-01,07\n02134,2.00,FALSE,2e-2,2024-12-31,10\n",
    "empties": b'a,b,c\n"",x,1\n,,2\n"q",,3\n',
    "na_words": b"x,y\n1,NA\nnull,2\nNaN,3\n",
    "bools": b"f\ntrue\nfalse\nTrue\n",
    "zero_one": b"b,c\n0,1\n1,0\n1,1\n",
    "dates": b"d\n2024-01-01\n2024-02-03\n",
    "timestamps": b"t\n2024-01-01 10:00:00\n2024-02-03 11:30:15\n",
    "zulu": b"t\n2024-01-01T10:00:00Z\n2024-02-03T11:30:15Z\n",
    "iso_t": b"t\n2024-01-01T10:00:00\n2024-02-03T11:30:15.250\n",
    "offset": b"t\n2024-01-01T10:00:00+02:00\n2024-02-03T11:30:15-01:00\n",
    "empty_numeric": b"a,b\n1,\n,2.5\n3,4\n",
    "negatives": b"i,f\n-1,-1.5\n+2,1e3\n",
    "big_ints": b"i\n9007199254740993\n-9223372036854775808\n",
    "mixed_int_float": b"v\n1\n2.5\n3\n",
    "spaces": b"a,b\n 1 , x \n2,y\n",
    "dup_headers": b"a,a,b\n1,2,3\n4,5,6\n",
    "quoted": b'a,b\n"1","x, y"\n"2","say ""hi"""\n',
    "multi_line": b'a,b\n1,"two\nlines"\n2,z\n',
    "late_odd": b"n\n" + b"".join(b"%d\n" % i for i in range(50)) + b"bad\n",
    "unicode": "name,v\nZoë,1\n東京,2\n".encode(),
    "trailing_no_newline": b"a,b\n1,2\n3,4",
    "crlf": b"a,b\r\n1,x\r\n2,y\r\n",
    "header_only": b"a,b\n",
    "one_column": b"only\n1\n2\n",
    "wide_short_row": b"a,b,c\n1,2\n3,4,5\n",
    "wide_long_row": b"a,b\n1,2,3\n4,5\n",
    "short_quoted_row": b'a,b,c\n"x,y"\n1,2,3\n',
    "float_text": b"v\n1.0\n2.50\n1e-3\n",
    "all_empty_col": b"a,b\n1,\n2,\n",
    "long_rows": b"a,b\n1,2\n4,5,6,7\n8,9\n",
    "open_quote": b'a,b,c\n1,"two, x\nlines",3\n2,z,4\n',
    "plus_mixed": b"i,j,k\n+1,2.0,+3\n3,+4,x\n-5,6,7\n",
}

CSV_OPTION_SETS: dict[str, str] = {
    "default": "read_delimited",
    "noinfer": "read_delimited: {infer_column_types: false}",
    "empty_str": "read_delimited: {empty_as_string: true}",
    "noheader": "read_delimited: {header: no_header}",
    "multiline": "read_delimited: {support_multi_line: true}",
}
CSV_MATRIX = {
    "default": list(CSV_DATA),
    "noinfer": ["wide_long_row", "long_rows", "negatives", "plus_mixed", "wide_short_row", "short_quoted_row", "basic", "people", "text_like", "empties", "na_words", "dates", "zulu",
                "negatives", "spaces", "dup_headers", "quoted", "late_odd", "float_text"],
    "empty_str": ["basic", "empties", "na_words", "all_empty_col", "people", "empty_numeric"],
    "noheader": ["basic", "text_like", "dup_headers", "one_column"],
    "multiline": ["basic", "multi_line", "quoted", "empties", "people"],
}  # fmt: skip


def csv_cases() -> list[Case]:
    out = []
    for opt, datasets in CSV_MATRIX.items():
        for data in datasets:
            text = table_text(file_entry("d.csv"), CSV_OPTION_SETS[opt])
            out.append(Case(f"csv_{opt}_{data}", {"d.csv": CSV_DATA[data]}, text))
    return out


# -- delimited text: delimiters, encodings, several files -----------------------


def csv_variants() -> list[Case]:
    one = file_entry("d.csv")
    rows = "id;name\n1;Zoë\n2;Ålborg\n"
    out = [
        Case(
            "delim_semicolon",
            {"d.csv": b"a;b\n1;x\n2;y\n"},
            table_text(one, "read_delimited: {delimiter: ';'}"),
        ),
        Case(
            "delim_tab",
            {"d.csv": b"a\tb\n1\tx\n2\ty\n"},
            table_text(one, 'read_delimited: {delimiter: "\\t"}'),
        ),
        Case(
            "delim_pipe",
            {"d.csv": b"a|b\n1|x,y\n2|z\n"},
            table_text(one, "read_delimited: {delimiter: '|'}"),
        ),
    ]
    for enc, codec in (
        ("latin1", "latin-1"),
        ("iso88591", "iso-8859-1"),
        ("windows1252", "cp1252"),
        ("utf16", "utf-16"),
        ("utf8bom", "utf-8-sig"),
        ("utf8", "utf-8"),
    ):
        data = rows.replace(";", ",").encode(codec)
        out.append(
            Case(
                f"encoding_{enc}",
                {"d.csv": data},
                table_text(one, f"read_delimited: {{encoding: {enc}}}"),
            )
        )
    for enc, codec in (
        ("utf-8", "utf-8"),
        ("latin-1", "latin-1"),
        ("iso-8859-1", "latin-1"),
        ("windows-1252", "cp1252"),
        ("utf-16", "utf-16"),
        ("utf8 bom", "utf-8-sig"),
    ):
        data = rows.replace(";", ",").encode(codec)
        out.append(
            Case(
                f"encoding_{enc.replace(' ', '_').replace('-', '_')}_spelt",
                {"d.csv": data},
                table_text(one, f"read_delimited: {{encoding: '{enc}'}}"),
            )
        )
    overrides = {
        "text": "[{columns: zip, column_type: string}]",
        "int_float": "[{columns: [zip, m], column_type: int}, {columns: price, column_type: float}]",
        "bool": "[{columns: flag, column_type: boolean}]",
        "datetime": "[{columns: day, column_type: {datetime: {formats: '%Y-%m-%d'}}}]",
    }
    for name, conv in overrides.items():
        step = f"read_delimited: {{infer_column_types: {{sample_size: 10, column_type_overrides: {conv}}}}}"
        out.append(
            Case(f"infer_overrides_{name}", {"d.csv": CSV_DATA["text_like"]}, table_text(one, step))
        )
    two = {"d/a.csv": b"a,b\n1,x\n2,y\n", "d/b.csv": b"a,b\n3,z\n"}
    other = {"d/a.csv": b"a,b\n1,x\n", "d/b.csv": b"b,c\ny,2.5\n"}
    typed = {"d/a.csv": b"a\n1\n2\n", "d/b.csv": b"a\n1.5\n"}
    folder = "  - folder: ./d\n"
    pattern = "  - pattern: ./d/*.csv\n"
    for header in ("all_files_same_headers", "from_first_file", "all_files_different_headers"):
        step = f"read_delimited: {{header: {header}}}"
        out.append(Case(f"files_same_{header}", two, table_text(folder, step)))
        out.append(Case(f"files_other_{header}", other, table_text(folder, step)))
    out += [
        Case("files_pattern", two, table_text(pattern, "read_delimited")),
        Case("files_int_then_float", typed, table_text(pattern, "read_delimited")),
        Case("files_named_twice", two,
             table_text(file_entry("d/a.csv") + file_entry("d/a.csv"), "read_delimited")),
        Case("files_listing_order", {"d/b.csv": b"a\n2\n", "d/a.csv": b"a\n1\n",
                                     "d/c/z.csv": b"a\n3\n"},
             table_text("  - pattern: ./d/**/*.csv\n", "read_delimited")),
        Case("files_path_column", two,
             table_text(folder, "read_delimited: {include_path_column: true}")),
        Case("files_paths_only", two, table_text(folder)),
        Case("files_take_file_level", two, table_text(folder, "take: 1", "read_delimited")),
    ]  # fmt: skip
    return out
