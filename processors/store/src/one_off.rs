//! Statements whose text depends on the batch (one placeholder group per row or id), built
//! with `QueryBuilder`: each batch size is its own statement. Cached, every shape would stay
//! prepared on every connection of the pool, in our memory and against MariaDB's
//! `max_prepared_stmt_count`, and push the fixed statements out of the per-connection cache.
//! So they are prepared for the one execution only (`persistent(false)`).

use sqlx::mysql::{MySql, MySqlArguments, MySqlRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{FromRow, QueryBuilder};

/// `build*()` for a statement that is not kept prepared.
pub trait OneOff {
    fn one_off(&mut self) -> Query<'_, MySql, MySqlArguments>;
    fn one_off_as<'q, T: FromRow<'q, MySqlRow>>(
        &'q mut self,
    ) -> QueryAs<'q, MySql, T, MySqlArguments>;
    fn one_off_scalar<'q, T>(&'q mut self) -> QueryScalar<'q, MySql, T, MySqlArguments>
    where
        (T,): for<'r> FromRow<'r, MySqlRow>;
}

impl OneOff for QueryBuilder<'_, MySql> {
    fn one_off(&mut self) -> Query<'_, MySql, MySqlArguments> {
        self.build().persistent(false)
    }

    fn one_off_as<'q, T: FromRow<'q, MySqlRow>>(
        &'q mut self,
    ) -> QueryAs<'q, MySql, T, MySqlArguments> {
        self.build_query_as().persistent(false)
    }

    fn one_off_scalar<'q, T>(&'q mut self) -> QueryScalar<'q, MySql, T, MySqlArguments>
    where
        (T,): for<'r> FromRow<'r, MySqlRow>,
    {
        self.build_query_scalar().persistent(false)
    }
}

/// `(?, ?, …)` binding each of `values`: the list of an `IN`, whose text depends on its
/// length (so the statement runs as a [`OneOff`]).
pub fn in_list_of<'a, T>(q: &mut QueryBuilder<'a, MySql>, values: impl IntoIterator<Item = T>)
where
    T: 'a + sqlx::Encode<'a, MySql> + sqlx::Type<MySql>,
{
    q.push("(");
    let mut list = q.separated(", ");
    for v in values {
        list.push_bind(v);
    }
    list.push_unseparated(")");
}

/// ` WHEN ? THEN ?` for each `(id, value)`: the arms of a `CASE id` that gives each row of a
/// group its own value in one multi-row statement.
pub(crate) fn when_id_then<'a, T>(
    q: &mut QueryBuilder<'a, MySql>,
    arms: impl IntoIterator<Item = (u64, T)>,
) where
    T: 'a + sqlx::Encode<'a, MySql> + sqlx::Type<MySql>,
{
    for (id, value) in arms {
        q.push(" WHEN ").push_bind(id);
        q.push(" THEN ").push_bind(value);
    }
}
