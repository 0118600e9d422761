//! The C ABI: argument checks, panic boundary, handle casts. No logic.
