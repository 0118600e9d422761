//! The generated blocks of capi/src: the C side's copies of the library's
//! lists (rdmamig_stats' counters, rdmamig_status, ...), which cbindgen must
//! see as plain Rust (it cannot expand macros on stable Rust). Each block
//! sits between `// BEGIN generated from SOURCE (make generate)` and the next
//! `// END generated`; a `generated_*` test builds its text from the library
//! and compares, or with `RDMAMIG_REGENERATE=1` (`make generate`) rewrites it.
//!
//! What a block is made from must not need the block to compile: the crate
//! is built before the test can rewrite it, so the code around a block may
//! rely on what the block has, never on the library's list having no more.

/// Checks that the block generated from `source` in capi/src/`file` is
/// `text`; with `RDMAMIG_REGENERATE` set, rewrites it instead.
pub(crate) fn check_or_rewrite(file: &str, source: &str, text: &str) {
    let path = format!("{}/src/{file}", env!("CARGO_MANIFEST_DIR"));
    let old = std::fs::read_to_string(&path).unwrap();
    let begin = format!("// BEGIN generated from {source} (make generate)\n");
    let start = old.find(&begin).unwrap_or_else(|| panic!("{file}: no `{}`", begin.trim_end())) + begin.len();
    let end = start + old[start..].find("// END generated").unwrap_or_else(|| panic!("{file}: no END after {source}"));
    // The END line's indentation is not the block's.
    let stop = old[..end].rfind('\n').map_or(end, |i| i + 1).max(start);
    if std::env::var_os("RDMAMIG_REGENERATE").is_some() {
        std::fs::write(&path, format!("{}{text}{}", &old[..start], &old[stop..])).unwrap();
    } else {
        assert_eq!(old[start..stop], *text, "capi/src/{file} is stale ({source}): run `make generate`");
    }
}

/// `doc` (one line per `///` line, as a doc attribute holds it) as `///`
/// comments indented by `indent`.
pub(crate) fn doc_comment(indent: &str, doc: &str) -> String {
    doc.lines().map(|line| format!("{indent}///{line}\n")).collect()
}
