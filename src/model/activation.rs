//! Element-wise helpers written op for op like their mlx-lm / mlx.nn counterparts, with
//! Python's "weak" scalars made in the activation dtype so bf16 stays bf16.
//!
//! mlx-lm wraps several of these in `mx.compile(shapeless=True)` (`nn.gelu_approx`, Gemma-4's
//! `geglu` and `logit_softcap`, Gemma-3's `clip_residual`). On a GPU a compiled graph becomes
//! one fused JIT kernel, which rounds differently from the same ops run one by one (fused
//! multiply-adds, no intermediate stores), so matching mlx-lm bit for bit there needs the same
//! compiled functions with the same boundaries: each public function here is compiled
//! (shapeless) exactly where mlx-lm's is, nesting included (`geglu` calls the compiled
//! `gelu_approx`, as mlx-lm's calls `nn.gelu_approx`).
//!
//! Compiled closures are not `Send` (MLX keys its compile cache per function id), so each
//! thread compiles its own once, on first use. Scalar constants are built and evaluated
//! outside the traced functions and captured, as Python's literals are: an evaluated scalar
//! array, no cast node in the graph.
use std::cell::RefCell;
use std::collections::HashMap;

use mlx_rs::error::Exception;
use mlx_rs::ops::{clip as mlx_clip, tanh};
use mlx_rs::transforms::compile::compile;
use mlx_rs::{Array, Dtype};

use crate::error::Result;

type Unary = Box<dyn FnMut(&Array) -> std::result::Result<Array, Exception>>;
/// Takes `[a, b]`, returns `[out]`.
type Binary = Box<dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception>>;

/// `sqrt(2 / pi)` as Python computes `math.sqrt(2 / math.pi)` (f64, then f32 in the array).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// `mx.finfo(mx.float16).max`.
const F16_MAX: f32 = 65504.0;

thread_local! {
    /// Evaluated scalar constants by (f64 bits, dtype).
    static CONSTS: RefCell<HashMap<(u64, Dtype), Array>> = RefCell::new(HashMap::new());
    static GELU_APPROX: RefCell<Unary> = RefCell::new(Box::new(compile(gelu_approx_body, true)));
    static GEGLU: RefCell<Binary> = RefCell::new(Box::new(compile(geglu_body, true)));
    static CLIP_RESIDUAL: RefCell<Binary> =
        RefCell::new(Box::new(compile(clip_residual_body, true)));
    /// `logit_softcap` per cap value (Python's compile keys its cache on the float argument).
    static SOFTCAP: RefCell<HashMap<u32, Unary>> = RefCell::new(HashMap::new());
}

/// A scalar of `dtype`, as MLX makes one from a Python float next to an array of that dtype
/// (the f64 is narrowed to f32 first, as MLX's Python binding does). Not for use inside a
/// traced function: see [`constant`].
pub fn scalar(v: f64, dtype: Dtype) -> Result<Array> {
    Ok(Array::from_f32(v as f32).as_dtype(dtype)?)
}

/// Makes sure the constant `v` of `dtype` exists, evaluated (call outside any trace).
fn prepare(v: f64, dtype: Dtype) -> Result<()> {
    let key = (v.to_bits(), dtype);
    if CONSTS.with(|c| c.borrow().contains_key(&key)) {
        return Ok(());
    }
    let a = scalar(v, dtype)?;
    a.eval()?;
    CONSTS.with(|c| c.borrow_mut().insert(key, a));
    Ok(())
}

/// [`scalar`], made and evaluated once per (value, dtype) on this thread and shared after
/// that: a decode step that scales by a fixed number then reads an existing array instead of
/// writing a new one from the host and casting it on the device every step (on MLX's CUDA
/// backend such few-byte arrays share one managed-memory pool with the step's own small
/// results). Same bits as [`scalar`].
pub fn cached_scalar(v: f64, dtype: Dtype) -> Result<Array> {
    prepare(v, dtype)?;
    Ok(constant(v, dtype)?)
}

/// The constant made by [`prepare`] (inside a traced function: no new graph node).
fn constant(v: f64, dtype: Dtype) -> std::result::Result<Array, Exception> {
    CONSTS
        .with(|c| c.borrow().get(&(v.to_bits(), dtype)).cloned())
        .ok_or_else(|| Exception::custom(format!("constant {v} of {dtype:?} not prepared")))
}

fn prepare_gelu(dtype: Dtype) -> Result<()> {
    for v in [0.5, 1.0, 3.0, 0.044715, SQRT_2_OVER_PI] {
        prepare(v, dtype)?;
    }
    Ok(())
}

/// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`.
fn gelu_approx_body(x: &Array) -> std::result::Result<Array, Exception> {
    let dt = x.dtype();
    let half_x = constant(0.5, dt)?.multiply(x)?;
    let cube = x.power(constant(3.0, dt)?)?;
    let inner = x.add(constant(0.044715, dt)?.multiply(&cube)?)?;
    let t = tanh(constant(SQRT_2_OVER_PI, dt)?.multiply(&inner)?)?;
    half_x.multiply(constant(1.0, dt)?.add(&t)?)
}

/// The compiled `gelu_approx` without the constant preparation (callable inside a trace).
fn gelu_approx_compiled(x: &Array) -> std::result::Result<Array, Exception> {
    GELU_APPROX.with(|f| (f.borrow_mut())(x))
}

fn geglu_body(args: &[Array]) -> std::result::Result<Vec<Array>, Exception> {
    let (gate, x) = two(args)?;
    Ok(vec![gelu_approx_compiled(gate)?.multiply(x)?])
}

fn two(args: &[Array]) -> std::result::Result<(&Array, &Array), Exception> {
    match args {
        [a, b] => Ok((a, b)),
        _ => Err(Exception::custom(format!(
            "expected 2 arguments, got {}",
            args.len()
        ))),
    }
}

/// Calls a compiled [`Binary`] and takes its single output.
fn call2(f: &mut Binary, a: &Array, b: &Array) -> Result<Array> {
    let mut out = f(&[a.clone(), b.clone()])?;
    out.pop()
        .ok_or_else(|| crate::error::Error::InvalidArgument("compiled function: no output".into()))
}

fn clip_residual_body(args: &[Array]) -> std::result::Result<Vec<Array>, Exception> {
    let (x, y) = two(args)?;
    if x.dtype() != Dtype::Float16 {
        return Ok(vec![x.add(y)?]);
    }
    let s = x
        .as_dtype(Dtype::Float32)?
        .add(y.as_dtype(Dtype::Float32)?)?;
    let lo = constant(-(F16_MAX as f64), Dtype::Float32)?;
    let hi = constant(F16_MAX as f64, Dtype::Float32)?;
    Ok(vec![mlx_clip(&s, (&lo, &hi))?.as_dtype(Dtype::Float16)?])
}

/// `nn.gelu_approx` (compiled, shapeless).
pub fn gelu_approx(x: &Array) -> Result<Array> {
    prepare_gelu(x.dtype())?;
    Ok(gelu_approx_compiled(x)?)
}

/// Gemma-4's `geglu(gate, x) = nn.gelu_approx(gate) * x` (compiled, shapeless).
pub fn geglu(gate: &Array, x: &Array) -> Result<Array> {
    prepare_gelu(gate.dtype())?;
    GEGLU.with(|f| call2(&mut f.borrow_mut(), gate, x))
}

/// Gemma-4's `logit_softcap(cap, x) = tanh(x / cap) * cap` (compiled, shapeless).
pub fn softcap(x: &Array, cap: f32) -> Result<Array> {
    let c = cap as f64;
    prepare(c, x.dtype())?;
    let out = SOFTCAP.with(|m| {
        let mut m = m.borrow_mut();
        let f = m.entry(cap.to_bits()).or_insert_with(|| {
            Box::new(compile(
                move |x: &Array| -> std::result::Result<Array, Exception> {
                    let c = constant(c, x.dtype())?;
                    tanh(x.divide(&c)?)?.multiply(&c)
                },
                true,
            ))
        });
        f(x)
    })?;
    Ok(out)
}

/// Gemma-3's `clip_residual(x, y)`: `x + y`, summed in f32 and clipped to the f16 range when
/// activations are f16 (compiled, shapeless).
pub fn clip_residual(x: &Array, y: &Array) -> Result<Array> {
    prepare(-(F16_MAX as f64), Dtype::Float32)?;
    prepare(F16_MAX as f64, Dtype::Float32)?;
    CLIP_RESIDUAL.with(|f| call2(&mut f.borrow_mut(), x, y))
}
