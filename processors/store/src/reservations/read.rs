//! Reads of reservation rows by id, by item and by order.

use super::{Reservation, COLUMNS};
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use sqlx::{MySql, MySqlPool};

pub async fn find(pool: &MySqlPool, id: u64) -> Result<Option<Reservation>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional(pool)
    .deadline()
    .await
}

pub async fn find_by_item(
    pool: &MySqlPool,
    order_item_id: u64,
    dish_id: u64,
) -> Result<Option<Reservation>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE order_item_id = ? AND dish_id = ?"
    ))
    .bind(order_item_id)
    .bind(dish_id)
    .fetch_optional(pool)
    .deadline()
    .await
}

pub async fn list_by_order(
    pool: &MySqlPool,
    order_id: u64,
) -> Result<Vec<Reservation>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE order_id = ? ORDER BY order_item_id, dish_id"
    ))
    .bind(order_id)
    .fetch_all(pool)
    .deadline()
    .await
}

/// [`list_by_order`] for several orders in one statement, in order id order (an empty
/// slice reads nothing).
pub async fn list_by_orders(
    pool: &MySqlPool,
    order_ids: &[u64],
) -> Result<Vec<Reservation>, sqlx::Error> {
    if order_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = sqlx::QueryBuilder::<MySql>::new(format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE order_id IN "
    ));
    in_list_of(&mut query, order_ids.iter().copied());
    query.push(" ORDER BY order_id, order_item_id, dish_id");
    query
        .one_off_as::<Reservation>()
        .fetch_all(pool)
        .deadline()
        .await
}
