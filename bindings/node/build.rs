//! napi-rs link setup, plus an rpath to the prebuilt libmlx on non-Apple targets (the root
//! crate's link args do not reach this artifact).
fn main() {
    napi_build::setup();
    if let Ok(libdir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    }
}
