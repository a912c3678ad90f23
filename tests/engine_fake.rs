//! The engine thread, queue, tickets and lifecycle, driven by a deterministic fake backend (no
//! model): what is tested here is scheduling and error plumbing, not generation. The real
//! model's end-to-end answers are checked in tests/engine_model.rs and the host tests.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use memexec::config::Config;
use memexec::engine::{
    Backend, BackendInfo, CallOptions, Completion, Engine, Generate, Intake, Job, LocalInput,
    Serial, StopReason,
};
use memexec::Error;

/// One "token" per character of `stage|system|user`, a short sleep per token so requests
/// overlap; records which threads it ran on.
struct Fake {
    step: Duration,
    threads: Arc<Mutex<Vec<ThreadId>>>,
}

fn expected(stage: &str, input: &LocalInput, max_tokens: usize) -> String {
    let full = format!(
        "{stage}|{}|{}",
        input.system.as_deref().unwrap_or("-"),
        input.user
    );
    full.chars().take(max_tokens).collect()
}

impl Generate for Fake {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            mode: "serial".into(),
            max_context: 64,
            weights: "quantized".into(),
            prompter: None,
        }
    }

    fn generate(&mut self, job: &Job) -> memexec::Result<Completion> {
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        if job.input.user.len() > 64 {
            return Err(Error::PromptTooLong {
                tokens: job.input.user.len(),
                limit: 64,
                why: "the model's context",
            });
        }
        if job.input.user == "panic" {
            panic!("fake backend asked to panic");
        }
        let text = expected(&job.stage, &job.input, job.max_tokens);
        for _ in text.chars() {
            if let Some(e) = job.interruption() {
                return Err(e);
            }
            std::thread::sleep(self.step);
        }
        Ok(Completion {
            ids: text.chars().map(|c| c as u32).collect(),
            stop: if text.chars().count() == job.max_tokens {
                StopReason::MaxTokens
            } else {
                StopReason::Eos
            },
            text,
            prompt_tokens: job.input.user.len(),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            speculation: None,
        })
    }
}

fn config() -> Config {
    let mut c = Config::for_model("/fake");
    c.limits.max_batch = 16;
    c
}

fn start(step_ms: u64) -> (Engine, Arc<Mutex<Vec<ThreadId>>>) {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let t = threads.clone();
    let engine = Engine::with_loader(
        config(),
        Box::new(move |_| {
            t.lock().unwrap().push(std::thread::current().id());
            Ok(Box::new(Serial(Fake {
                step: Duration::from_millis(step_ms),
                threads: t,
            })) as Box<dyn Backend>)
        }),
    )
    .expect("fake engine starts");
    (engine, threads)
}

fn input(user: &str) -> LocalInput {
    LocalInput {
        system: None,
        user: user.into(),
    }
}

#[test]
fn call_and_batch_preserve_order() {
    let (engine, _) = start(0);
    let one = engine
        .call("route", input("hello"), CallOptions::default())
        .unwrap();
    assert_eq!(one.text, expected("route", &input("hello"), 256));
    let inputs: Vec<LocalInput> = ["a", "bbbbbbbbbbbb", "cc", "", "dddd"]
        .iter()
        .map(|u| input(u))
        .collect();
    let out = engine
        .batch(
            "chunk",
            inputs.clone(),
            CallOptions {
                max_tokens: Some(9),
            },
        )
        .unwrap();
    let want: Vec<String> = inputs.iter().map(|i| expected("chunk", i, 9)).collect();
    assert_eq!(out.iter().map(|c| c.text.clone()).collect::<Vec<_>>(), want);
    assert!(engine
        .batch("chunk", vec![], CallOptions::default())
        .unwrap()
        .is_empty());
    let stats = engine.stats();
    assert_eq!(stats.completed, 6);
    assert_eq!(stats.mode, "serial");
}

#[test]
fn every_backend_call_runs_on_the_one_engine_thread() {
    let (engine, threads) = start(0);
    let engine = Arc::new(engine);
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let e = engine.clone();
            std::thread::spawn(move || {
                e.call("x", input(&format!("t{i}")), CallOptions::default())
                    .unwrap()
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let seen = threads.lock().unwrap().clone();
    assert_eq!(seen.len(), 5, "loader + 4 generations");
    assert!(seen.iter().all(|t| *t == seen[0]), "{seen:?}");
    assert_ne!(seen[0], std::thread::current().id());
}

#[test]
fn argument_limits_are_checked_before_queueing() {
    let (engine, _) = start(0);
    let zero = engine.call(
        "x",
        input("a"),
        CallOptions {
            max_tokens: Some(0),
        },
    );
    assert!(
        matches!(zero, Err(Error::InvalidArgument(ref m)) if m.contains("max_tokens")),
        "{zero:?}"
    );
    let huge = engine.call(
        "x",
        input("a"),
        CallOptions {
            max_tokens: Some(64_001),
        },
    );
    assert!(
        matches!(huge, Err(Error::InvalidArgument(ref m)) if m.contains("64000")),
        "{huge:?}"
    );
    let big_batch = engine.batch("x", vec![input("a"); 17], CallOptions::default());
    assert!(
        matches!(big_batch, Err(Error::InvalidArgument(ref m)) if m.contains("max_batch")),
        "{big_batch:?}"
    );
    // The engine still serves.
    assert!(engine.call("x", input("a"), CallOptions::default()).is_ok());
}

#[test]
fn a_failing_batch_input_is_named_and_the_engine_stays_usable() {
    let (engine, _) = start(0);
    let long = "x".repeat(65);
    let err = engine
        .batch(
            "x",
            vec![input("a"), input(&long), input("c")],
            CallOptions::default(),
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::BatchItem { index: 1, ref source } if matches!(**source, Error::PromptTooLong { .. })),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("input 1: prompt has 65 tokens"),
        "{err}"
    );
    assert!(engine.call("x", input("a"), CallOptions::default()).is_ok());
}

#[test]
fn a_backend_panic_fails_only_its_request() {
    let (engine, _) = start(0);
    let err = engine
        .call("x", input("panic"), CallOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::Internal(_)), "{err}");
    assert!(engine
        .call("x", input("after"), CallOptions::default())
        .is_ok());
}

#[test]
fn poll_does_not_block_and_cancel_stops_a_request() {
    let (engine, _) = start(20);
    let mut ticket = engine
        .submit("x", input("a long enough input"), CallOptions::default())
        .unwrap();
    let t0 = Instant::now();
    assert!(ticket.poll().is_none());
    assert!(t0.elapsed() < Duration::from_millis(15), "poll blocked");
    ticket.cancel();
    let deadline = Instant::now() + Duration::from_secs(5);
    let result = loop {
        if let Some(r) = ticket.poll() {
            break r;
        }
        assert!(Instant::now() < deadline, "cancel did not end the request");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    assert_eq!(engine.stats().cancelled, 1);
}

#[test]
fn close_with_requests_in_flight_fails_them_with_closed() {
    let (engine, _) = start(20);
    let engine = Arc::new(engine);
    let callers: Vec<_> = (0..3)
        .map(|i| {
            let e = engine.clone();
            std::thread::spawn(move || {
                e.call("x", input(&format!("request {i}")), CallOptions::default())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(60));
    engine.close();
    for c in callers {
        let r = c.join().unwrap();
        assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    }
    assert!(matches!(
        engine.call("x", input("late"), CallOptions::default()),
        Err(Error::Closed)
    ));
    engine.close(); // idempotent
}

#[test]
fn a_failed_load_is_reported_and_not_cached() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let loader = |attempts: Arc<AtomicUsize>| -> memexec::engine::Loader {
        Box::new(move |_| {
            if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(Error::Io {
                    path: "/fake/config.json".into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                })
            } else {
                Ok(Box::new(Serial(Fake {
                    step: Duration::ZERO,
                    threads: Arc::default(),
                })) as Box<dyn Backend>)
            }
        })
    };
    let first = Engine::with_loader(config(), loader(attempts.clone()));
    let err = first.err().expect("the first load fails");
    assert!(matches!(err, Error::Load(_)), "{err}");
    assert!(err.to_string().contains("/fake/config.json"), "{err}");
    let second = Engine::with_loader(config(), loader(attempts.clone())).expect("a retry loads");
    assert!(second
        .call("x", input("ok"), CallOptions::default())
        .is_ok());
    let panicking = Engine::with_loader(config(), Box::new(|_| panic!("loader exploded")));
    assert!(matches!(panicking, Err(Error::Load(_))));
}

/// A backend that admits queued jobs between steps, as the continuous-batching scheduler will:
/// it records how many rows were live at once.
struct Stepper {
    max_live: Arc<AtomicUsize>,
}

impl Backend for Stepper {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            mode: "batched".into(),
            max_context: 64,
            weights: "quantized".into(),
            prompter: None,
        }
    }

    fn run(&mut self, jobs: Vec<Job>, intake: &mut Intake<'_>) {
        let mut live: Vec<(Job, usize)> = jobs.into_iter().map(|j| (j, 0)).collect();
        while !live.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
            self.max_live.fetch_max(live.len(), Ordering::SeqCst);
            let mut still = Vec::new();
            for (job, steps) in live {
                if steps + 1 >= job.max_tokens {
                    let text = job.input.user.clone();
                    job.finish(Ok(Completion {
                        ids: vec![0; steps + 1],
                        text,
                        prompt_tokens: 1,
                        stop: StopReason::MaxTokens,
                        prefill_time: Duration::ZERO,
                        decode_time: Duration::ZERO,
                        speculation: None,
                    }));
                } else {
                    still.push((job, steps + 1));
                }
            }
            live = still;
            live.extend(intake.pull().into_iter().map(|j| (j, 0)));
        }
    }
}

#[test]
fn concurrent_callers_can_share_steps() {
    let max_live = Arc::new(AtomicUsize::new(0));
    let m = max_live.clone();
    let engine = Arc::new(
        Engine::with_loader(
            config(),
            Box::new(move |_| Ok(Box::new(Stepper { max_live: m }) as Box<dyn Backend>)),
        )
        .unwrap(),
    );
    let callers: Vec<_> = (0..8)
        .map(|i| {
            let e = engine.clone();
            std::thread::spawn(move || {
                (0..10)
                    .map(|k| {
                        let user = format!("{i}-{k}");
                        let got = e
                            .call(
                                "x",
                                input(&user),
                                CallOptions {
                                    max_tokens: Some(4),
                                },
                            )
                            .unwrap();
                        assert_eq!(got.text, user);
                    })
                    .count()
            })
        })
        .collect();
    let done: usize = callers.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(done, 80);
    assert!(
        max_live.load(Ordering::SeqCst) > 1,
        "no two requests ever shared a step"
    );
}
