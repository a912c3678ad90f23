//! The three benchmark workloads of BENCH.md, generated deterministically from a seed:
//! realistic memory-pipeline prompts (conversation chunks with uuids, entity extraction,
//! yes/no routing, one-line summaries) whose lengths differ the way the real ones do.
use rand::{seq::IndexedRandom, Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One prompt of a workload: a stage name plus the seam's `{system?, user}` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchPrompt {
    /// The pipeline stage (selects the default system prompt and adapter).
    pub stage: String,
    /// An explicit system prompt, or `None` for the stage default.
    pub system: Option<String>,
    /// The user turn.
    pub user: String,
}

/// A named set of prompts with the token budget the pipeline gives them.
#[derive(Debug, Clone)]
pub struct Workload {
    /// `EXTRACT`, `SHORT` or `UNIFORM`.
    pub name: &'static str,
    /// The prompts, in submission order.
    pub prompts: Vec<BenchPrompt>,
    /// `max_tokens` of every call.
    pub max_tokens: usize,
}

const PEOPLE: &[&str] = &[
    "Ada Lovelace",
    "Grace Hopper",
    "Linus",
    "Margaret Hamilton",
    "Ken",
    "Barbara Liskov",
    "Dennis",
    "Frances Allen",
    "Edsger",
    "Radia Perlman",
    "Tim",
    "Sophie Wilson",
];
const PROJECTS: &[&str] = &[
    "the billing migration",
    "Project Atlas",
    "the Q3 roadmap",
    "the onboarding flow",
    "the search index rebuild",
    "the mobile release",
    "the data retention policy",
    "the incident review",
    "the pricing experiment",
    "the memory pipeline",
];
const CLAUSES: &[&str] = &[
    "we agreed to move the deadline to next Friday",
    "the staging cluster ran out of disk again last night",
    "I think we should split the work into two milestones",
    "the customer asked whether exports can include archived items",
    "nobody owns the flaky integration test yet",
    "the latency regression came from the new serializer",
    "legal wants a summary before anything ships",
    "let's pair on the schema change tomorrow morning",
    "the dashboard numbers do not match the warehouse",
    "we should write this decision down so it does not get lost",
    "the contractor finishes at the end of the month",
    "I will send the notes to everybody after lunch",
];

fn uuid(rng: &mut ChaCha8Rng) -> String {
    let b: [u8; 16] = rng.random();
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

fn pick<'a>(rng: &mut ChaCha8Rng, items: &[&'a str]) -> &'a str {
    items.choose(rng).copied().unwrap_or_default()
}

/// A conversation transcript of about `words` words, one message per line with a uuid.
fn transcript(rng: &mut ChaCha8Rng, words: usize) -> String {
    let mut out = String::new();
    let mut count = 0;
    while count < words {
        let line = format!(
            "[{}] {}: about {}, {}.\n",
            uuid(rng),
            pick(rng, PEOPLE),
            pick(rng, PROJECTS),
            pick(rng, CLAUSES)
        );
        count += line.split_whitespace().count();
        out.push_str(&line);
    }
    out
}

/// EXTRACT: 8 entity-extraction prompts of ~330-470 tokens (lengths differ), 96 new tokens.
pub fn extract(seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let prompts = (0..8)
        .map(|i| {
            let words = 170 + 15 * i + rng.random_range(0..20);
            BenchPrompt {
                stage: "entity".into(),
                system: None,
                user: format!(
                    "List every person, project and decision named in this conversation \
                     chunk as a JSON array of strings. Use the exact names.\n\n{}",
                    transcript(&mut rng, words)
                ),
            }
        })
        .collect();
    Workload {
        name: "EXTRACT",
        prompts,
        max_tokens: 96,
    }
}

/// SHORT: 8 yes/no routing questions over short excerpts, 24 new tokens.
pub fn short(seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5107);
    let prompts = (0..8)
        .map(|i| {
            let words = 15 + 12 * i;
            BenchPrompt {
                stage: "route".into(),
                system: None,
                user: format!(
                    "Does this excerpt mention {}? Answer yes or no.\n\n{}",
                    pick(&mut rng, PROJECTS),
                    transcript(&mut rng, words)
                ),
            }
        })
        .collect();
    Workload {
        name: "SHORT",
        prompts,
        max_tokens: 24,
    }
}

/// UNIFORM: 16 one-line summary requests of near-equal length, 64 new tokens.
pub fn uniform(seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0411);
    let prompts = (0..16)
        .map(|_| BenchPrompt {
            stage: "synthesis".into(),
            system: None,
            user: format!(
                "Write one sentence about {} for {}'s notes: {}.",
                pick(&mut rng, PROJECTS),
                pick(&mut rng, PEOPLE),
                pick(&mut rng, CLAUSES)
            ),
        })
        .collect();
    Workload {
        name: "UNIFORM",
        prompts,
        max_tokens: 64,
    }
}

/// All three workloads for one seed.
pub fn all(seed: u64) -> Vec<Workload> {
    vec![extract(seed), short(seed), uniform(seed)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_deterministic_and_shaped_like_bench_md() {
        let (a, b) = (all(7), all(7));
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.prompts, y.prompts, "{} is not deterministic", x.name);
        }
        assert_ne!(all(8)[0].prompts, a[0].prompts, "the seed must matter");
        let sizes: Vec<_> = a
            .iter()
            .map(|w| (w.name, w.prompts.len(), w.max_tokens))
            .collect();
        assert_eq!(
            sizes,
            [("EXTRACT", 8, 96), ("SHORT", 8, 24), ("UNIFORM", 16, 64)]
        );
        let lens: Vec<usize> = a[0].prompts.iter().map(|p| p.user.len()).collect();
        let distinct: std::collections::BTreeSet<_> = lens.iter().collect();
        assert_eq!(
            distinct.len(),
            lens.len(),
            "EXTRACT prompt lengths must differ: {lens:?}"
        );
    }
}
