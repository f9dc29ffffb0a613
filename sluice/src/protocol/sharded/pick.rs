//! Which of a spread bucket's rows an acquire goes to.
//!
//! One at random, so that the writes of many processes spread over the rows; drawn again
//! (twice at most) away from a row the store pushed back within the last [`AVOID`]. The
//! rows of a bucket hash onto the table's partitions independently, and a partition's
//! ceiling is shared: on a table of a few partitions two or three rows often share one
//! while another holds one alone. Picked evenly, the rows on a crowded partition are
//! throttled while the partition with one row has room, and the bucket gets what its
//! most crowded partitions allow (0.74 of four partitions' ceiling in one layout of eight
//! rows measured behind dynamodb-fidelity, 48 single-caller processes). Each client moves
//! its own writes off the rows that pushed it back, and the rows on crowded partitions
//! lose writes to the others until they stop being throttled.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use rand::RngExt as _;

use crate::dimension::Dimension;
use crate::shared::Core;
use crate::shared::lanes::Lane;

/// How long a row the store pushed back is drawn around.
pub(super) const AVOID: Duration = Duration::from_secs(1);

/// Draws at most: the first, and two more away from rows pushed back.
const DRAWS: u32 = 3;

/// The row of `base`'s bucket, over `shards` rows, that an acquire goes to (its index, its
/// key and its lane): at random, other than `except` (a row just tried) when there are
/// others, and drawn again away from a row pushed back of late. Every row pushed back:
/// the last draw stands.
pub(super) fn row(
    core: &Core,
    base: &Dimension,
    shards: u16,
    except: Option<u16>,
) -> (u16, Dimension, Arc<Lane>) {
    if shards <= 1 {
        return (0, base.clone(), core.lane(base));
    }
    let now = core.now().as_millis();
    let avoid = i64::try_from(AVOID.as_millis()).unwrap_or(i64::MAX);
    let mut rng = rand::rng();
    let mut drawn = None;
    for _ in 0..DRAWS {
        let k = match except {
            Some(tried) => (tried + rng.random_range(1..shards)) % shards,
            None => rng.random_range(0..shards),
        };
        let row = base.shard(k);
        let lane = core.lane(&row);
        let pushed_at = lane.pushed_at.load(Relaxed);
        let clear = pushed_at == 0 || now.saturating_sub(pushed_at) >= avoid;
        drawn = Some((k, row, lane));
        if clear {
            break;
        }
    }
    drawn.unwrap_or_else(|| (0, base.clone(), core.lane(base)))
}
