//! Build script: find libibverbs and librdmacm with pkg-config (link flags and
//! include paths), and compile the tiny C shim for the static-inline verbs
//! (`src/verbs/shim.c`). No bindgen/libclang: the Rust declarations are
//! hand-written in `src/verbs/sys.rs` and checked by `tests/verbs_layout.rs`.

fn probe(name: &str) -> pkg_config::Library {
    match pkg_config::Config::new().probe(name) {
        Ok(lib) => lib,
        Err(e) => panic!(
            "\n\nrdmamig needs {name} (rdma-core) to build, but pkg-config could not find it:\n\
             {e}\n\n\
             On Debian/Ubuntu install the development packages:\n    \
             sudo apt-get install libibverbs-dev librdmacm-dev pkg-config\n\
             (on Fedora/RHEL: rdma-core-devel pkgconf-pkg-config)\n\n"
        ),
    }
}

/// The compiler's minor version (`rustc 1.MINOR.x`), if it says.
fn rustc_minor() -> Option<u32> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = std::process::Command::new(rustc).arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace().nth(1)?.split('.').nth(1)?.parse().ok()
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/verbs/shim.c");

    // The AVX-512 zero scan needs the AVX-512 intrinsics, stable since Rust 1.89
    // (the crate builds with older compilers without it).
    println!("cargo:rustc-check-cfg=cfg(rdmamig_avx512)");
    if rustc_minor().is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=rdmamig_avx512");
    }

    let ibverbs = probe("libibverbs");
    let rdmacm = probe("librdmacm");

    let mut build = cc::Build::new();
    build.file("src/verbs/shim.c").warnings(true).extra_warnings(true);
    for path in ibverbs.include_paths.iter().chain(rdmacm.include_paths.iter()) {
        build.include(path);
    }
    build.compile("rdmamig_verbs_shim");
}
