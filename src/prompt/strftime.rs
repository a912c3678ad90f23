//! `strftime_now(format)`, the one date function Hugging Face gives chat templates.
//!
//! Python formats `datetime.now()` (naive local time). memexec formats the current UTC
//! time: the crate has no portable, thread-safe local-offset source, and templates use the
//! date only to tell the model today's date.
use std::time::{SystemTime, UNIX_EPOCH};

/// A broken-down civil time (proleptic Gregorian, no time zone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilTime {
    /// Year, e.g. 2025.
    pub year: i64,
    /// 1..=12.
    pub month: u32,
    /// 1..=31.
    pub day: u32,
    /// 0..=23.
    pub hour: u32,
    /// 0..=59.
    pub minute: u32,
    /// 0..=59.
    pub second: u32,
    /// 0..=999_999.
    pub microsecond: u32,
}

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

impl CivilTime {
    /// The civil time of `micros` microseconds since the Unix epoch (UTC).
    pub fn from_unix_micros(micros: i64) -> Self {
        let secs = micros.div_euclid(1_000_000);
        let microsecond = micros.rem_euclid(1_000_000) as u32;
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        Self {
            year,
            month,
            day,
            hour: sod / 3600,
            minute: sod / 60 % 60,
            second: sod % 60,
            microsecond,
        }
    }

    /// Now, in UTC.
    pub fn now_utc() -> Self {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Self::from_unix_micros(micros)
    }

    fn days(&self) -> i64 {
        days_from_civil(self.year, self.month, self.day)
    }

    /// 0 = Sunday.
    fn weekday(&self) -> usize {
        (self.days() + 4).rem_euclid(7) as usize
    }

    fn day_of_year(&self) -> i64 {
        self.days() - days_from_civil(self.year, 1, 1) + 1
    }

    /// Formats like C/Python `strftime` for the portable directives; unknown directives
    /// are copied through as written.
    pub fn format(&self, fmt: &str) -> String {
        let mut out = String::with_capacity(fmt.len() + 16);
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let wd = self.weekday();
            let month = MONTHS[(self.month.clamp(1, 12) - 1) as usize];
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            match d {
                'Y' => out.push_str(&self.year.to_string()),
                'y' => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                'm' => out.push_str(&format!("{:02}", self.month)),
                'd' => out.push_str(&format!("{:02}", self.day)),
                'e' => out.push_str(&format!("{:>2}", self.day)),
                'H' => out.push_str(&format!("{:02}", self.hour)),
                'I' => out.push_str(&format!("{hour12:02}")),
                'M' => out.push_str(&format!("{:02}", self.minute)),
                'S' => out.push_str(&format!("{:02}", self.second)),
                'f' => out.push_str(&format!("{:06}", self.microsecond)),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'j' => out.push_str(&format!("{:03}", self.day_of_year())),
                'A' => out.push_str(DAYS[wd]),
                'a' => out.push_str(&DAYS[wd][..3]),
                'B' => out.push_str(month),
                'b' | 'h' => out.push_str(&month[..3]),
                'w' => out.push_str(&wd.to_string()),
                'u' => out.push_str(&(if wd == 0 { 7 } else { wd }).to_string()),
                'F' => out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day)),
                'T' => out.push_str(&format!(
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                )),
                'D' => out.push_str(&format!(
                    "{:02}/{:02}/{:02}",
                    self.month,
                    self.day,
                    self.year.rem_euclid(100)
                )),
                // A naive datetime has no zone: Python prints nothing for these.
                'z' | 'Z' => {}
                '%' => out.push('%'),
                other => {
                    out.push('%');
                    out.push(other);
                }
            }
        }
        out
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
