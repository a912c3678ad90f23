//! Build script: (1) give every artifact of this crate an rpath to the prebuilt
//! libmlx on non-Apple targets (cargo does not pass a dependency's link args on);
//! (2) generate the C header from `src/capi/` with cbindgen.
use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=MEMEXEC_UPDATE_HEADER");

    // Set by the vendored mlx-sys (`cargo::metadata=libdir=...`) when it links a
    // prebuilt libmlx; absent on Apple targets, where MLX is linked statically.
    if let Ok(libdir) = env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
        println!("cargo:rustc-env=MEMEXEC_MLX_LIBDIR={libdir}");
    }

    generate_header();
}

/// Writes the header to `$OUT_DIR/memexec.h` on every build; the committed
/// `include/memexec.h` is compared against it by `tests/header_drift.rs` and is
/// rewritten only when `MEMEXEC_UPDATE_HEADER=1` (so a drift cannot hide).
fn generate_header() {
    let root =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let capi = root.join("src/capi");
    println!("cargo:rerun-if-changed={}", capi.display());
    let mut sources: Vec<PathBuf> = fs::read_dir(&capi)
        .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    sources.retain(|p| p.extension().is_some_and(|e| e == "rs"));
    sources.sort();
    let config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("valid cbindgen.toml");
    let mut builder = cbindgen::Builder::new().with_config(config);
    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        builder = builder.with_src(src);
    }
    let bindings = builder
        .generate()
        .expect("cbindgen could not generate include/memexec.h");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("memexec.h");
    bindings.write_to_file(&out);
    if env::var("MEMEXEC_UPDATE_HEADER").as_deref() == Ok("1") {
        bindings.write_to_file(root.join("include/memexec.h"));
    }
}
