//! Thin RAII wrappers over libibverbs/librdmacm; the only place with raw verbs calls.
