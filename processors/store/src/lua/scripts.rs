//! The inventory scripts (`lua/*.lua`) as the executor sends them: each is `_common.lua`
//! followed by its own file, compiled into the binary.

use redis::Script;

// Each script is `_common.lua` (shared helpers: result layout, op record, fence, invariant
// checks) followed by the script's own file; EVAL has no `require`, so the prelude is
// concatenated at compile time and the hash Redis caches is that of the whole text.
macro_rules! lua_script {
    ($file:literal) => {
        concat!(
            include_str!("../../../../lua/_common.lua"),
            include_str!(concat!("../../../../lua/", $file))
        )
    };
}

pub const TRY_LUA: &str = lua_script!("try.lua");
pub const CONFIRM_LUA: &str = lua_script!("confirm.lua");
pub const CANCEL_LUA: &str = lua_script!("cancel.lua");
pub const REFUND_LUA: &str = lua_script!("refund.lua");
pub const INIT_BUCKET_LUA: &str = lua_script!("init_bucket.lua");
pub const ADJUST_LUA: &str = lua_script!("adjust.lua");
pub const SET_STATE_LUA: &str = lua_script!("set_state.lua");
pub const REPAIR_LUA: &str = lua_script!("repair.lua");
pub const RESTORE_FENCES_LUA: &str = lua_script!("restore_fences.lua");

/// The scripts, each with the SHA1 EVALSHA sends.
pub(super) struct Scripts {
    pub(super) try_reserve: Script,
    pub(super) confirm: Script,
    pub(super) cancel: Script,
    pub(super) refund: Script,
    pub(super) init_bucket: Script,
    pub(super) adjust: Script,
    pub(super) set_state: Script,
    pub(super) repair: Script,
    pub(super) restore_fences: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            try_reserve: Script::new(TRY_LUA),
            confirm: Script::new(CONFIRM_LUA),
            cancel: Script::new(CANCEL_LUA),
            refund: Script::new(REFUND_LUA),
            init_bucket: Script::new(INIT_BUCKET_LUA),
            adjust: Script::new(ADJUST_LUA),
            set_state: Script::new(SET_STATE_LUA),
            repair: Script::new(REPAIR_LUA),
            restore_fences: Script::new(RESTORE_FENCES_LUA),
        }
    }
}
