// X-macro lists of an option struct's plain fields (a number or a bool each):
//   #define PYDFLASH_<STRUCT>_FIELDS(X) X(type, name, default, "one-line doc") ...
// One list declares the fields (PYDFLASH_DECLARE_FIELD, inside the struct) and
// drives their bindings (csrc/bindings/options.cpp), so a field is written once;
// _core.pyi's lines for them are written from the binding (tools/write_stub.py).
#pragma once

#define PYDFLASH_DECLARE_FIELD(type, name, init, doc) type name = init;
