//! `memexec smoke`: proves MLX loads and computes (a 4-bit matmul against its dense twin).
use mlx_rs::{ops, random, Array};

/// Arguments of `memexec smoke`.
#[derive(clap::Args)]
pub struct Args {
    /// Rows of the weight matrix.
    #[arg(long, default_value_t = 256)]
    out_features: i32,
    /// Columns of the weight matrix (a multiple of 64).
    #[arg(long, default_value_t = 512)]
    in_features: i32,
}

pub fn run(args: Args) -> memexec::Result<()> {
    let key = random::key(0)?;
    let w = random::normal::<f32>(&[args.out_features, args.in_features], None, None, &key)?;
    let x = random::normal::<f32>(&[4, args.in_features], None, None, &random::key(1)?)?;
    let (wq, scales, biases) = ops::quantize(&w, 64, 4)?;
    let y = ops::quantized_matmul(&x, &wq, &scales, &biases, true, 64, 4)?;
    let w_deq = ops::dequantize(&wq, &scales, &biases, 64, 4)?;
    let y_ref = ops::matmul(&x, w_deq.t())?;
    let max_diff: Array = ops::abs(&(&y - &y_ref))?.max(None)?;
    let rel: Array = ops::abs(&(&w_deq - &w))?.mean(None)?;
    println!(
        "memexec {} (C ABI {})",
        env!("CARGO_PKG_VERSION"),
        memexec::capi::MEMEXEC_ABI_VERSION
    );
    println!("device: {:?}", mlx_rs::Device::default());
    println!(
        "4-bit quantized_matmul [{}x{}]: max |qmm - dense(dequant)| = {:.3e}; mean |dequant - w| = {:.3e}",
        args.out_features,
        args.in_features,
        max_diff.item_exact::<f32>(),
        rel.item_exact::<f32>()
    );
    println!("y[0, ..4] = {:?}", &y.as_slice::<f32>()[..4]);
    Ok(())
}
