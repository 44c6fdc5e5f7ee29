//! A live line for long bench runs on a terminal: what is done of how much, the rate and the
//! time left, redrawn a few times a second on stderr (nothing when stderr is not a terminal,
//! so logs and `--json` output stay clean).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// Redraws per second at most: looking is cheap, drawing is not.
const REDRAWS_PER_SECOND: u8 = 4;

/// One measured run's progress.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A line for `total` items (events, messages) named `what`, e.g. `relay x3 run 1`.
    pub fn new(what: &str, total: u64) -> Self {
        let bar = ProgressBar::with_draw_target(
            Some(total),
            ProgressDrawTarget::stderr_with_hz(REDRAWS_PER_SECOND),
        );
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {human_pos}/{human_len} {rate}/s ETA {eta}",
        ) {
            let style = style
                .with_key(
                    "rate",
                    |state: &ProgressState, out: &mut dyn std::fmt::Write| {
                        let _ = write!(out, "{:.0}", state.per_sec());
                    },
                )
                .progress_chars("=> ");
            bar.set_style(style);
        }
        bar.set_prefix(what.to_owned());
        Self { bar }
    }

    /// `done` items so far.
    pub fn set(&self, done: u64) {
        self.bar.set_position(done);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // A finished or abandoned run leaves no half-drawn line behind.
        self.bar.finish_and_clear();
    }
}
