//! Binds each handler to its endpoint's declaration: [`Endpoints::endpoint`] takes a handler
//! only when what it answers, the body it takes and the query it reads are the endpoint's
//! (`routes::Endpoint`'s types), so a handler, the client and the OpenAPI document cannot
//! disagree about a route and compile.

use std::future::Future;

use axum::extract::{ConnectInfo, State};
use axum::handler::Handler;
use axum::response::Response;
use axum::routing::{MethodRouter, get, post, put};
use axum::{Extension, Router, body::Bytes};
use headroom_shared::routes::{
    Endpoint, Export, Json, JsonList, LogBytes, Method, NoBody, NoQuery, OctetStream, Query,
    RawBytes,
};

use super::{ApiError, ApiJson, ApiPath, ApiQuery, AppState};

/// What a handler returns for an answer marker.
pub trait ServerAnswer {
    type Out;
}

impl<T> ServerAnswer for Json<T> {
    type Out = ApiJson<T>;
}

impl<T> ServerAnswer for JsonList<T> {
    type Out = ApiJson<Vec<T>>;
}

impl<T> ServerAnswer for Export<T> {
    type Out = Response;
}

impl ServerAnswer for LogBytes {
    type Out = Response;
}

impl ServerAnswer for OctetStream {
    type Out = Response;
}

/// An extractor that takes the body `B` (a body marker), or, for [`NoBody`], one that takes
/// none. A handler's last extractor is its body's, as axum wants it.
pub trait TakesBody<B> {}

impl<T> TakesBody<Json<T>> for ApiJson<T> {}
impl TakesBody<RawBytes> for Bytes {}
/// A raw body read by the handler itself, against a bound of its own.
impl TakesBody<RawBytes> for axum::body::Body {}
impl<S> TakesBody<NoBody> for State<S> {}
impl<T> TakesBody<NoBody> for Extension<T> {}
impl<T> TakesBody<NoBody> for ApiPath<T> {}
impl<T> TakesBody<NoBody> for ApiQuery<T> {}
impl<T> TakesBody<NoBody> for ConnectInfo<T> {}

/// The query marker an extractor reads: [`Query`] for `ApiQuery`, else [`NoQuery`].
pub trait ReadsQuery {
    type Query;
}

impl<T> ReadsQuery for ApiQuery<T> {
    type Query = Query<T>;
}

macro_rules! reads_no_query {
    ($($t:ty),*) => {$(
        impl<T> ReadsQuery for $t {
            type Query = NoQuery;
        }
    )*};
}

reads_no_query!(
    State<T>,
    Extension<T>,
    ApiPath<T>,
    ApiJson<T>,
    ConnectInfo<T>
);

impl ReadsQuery for Bytes {
    type Query = NoQuery;
}

impl ReadsQuery for axum::body::Body {
    type Query = NoQuery;
}

/// The query of two extractors together: at most one reads one.
pub trait WithQuery<R> {
    type Out;
}

impl WithQuery<NoQuery> for NoQuery {
    type Out = NoQuery;
}

impl<T> WithQuery<Query<T>> for NoQuery {
    type Out = Query<T>;
}

impl<T> WithQuery<NoQuery> for Query<T> {
    type Out = Query<T>;
}

/// The query marker of a list of extractors (`(first, (second, ... ()))`): the one that reads
/// a query's, or [`NoQuery`].
pub trait QueryOf {
    type Query;
}

impl QueryOf for () {
    type Query = NoQuery;
}

impl<H: ReadsQuery, T: QueryOf> QueryOf for (H, T)
where
    H::Query: WithQuery<T::Query>,
{
    type Query = <H::Query as WithQuery<T::Query>>::Out;
}

/// `(T1, (T2, ... ()))`: a handler's extractors as a list [`QueryOf`] reads.
macro_rules! list {
    () => { () };
    ($t:ident $(, $rest:ident)*) => { ($t, list!($($rest),*)) };
}

/// A handler of `Args` that takes the body `B`, reads the query `Q` and answers `A`.
pub trait Serves<B, Q, A, Args> {}

impl<F, Fut, A> Serves<NoBody, NoQuery, A, ()> for F
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<A::Out, ApiError>>,
    A: ServerAnswer,
{
}

macro_rules! serves {
    ($($arg:ident),*) => {
        impl<F, Fut, B, Q, A, $($arg,)* Last> Serves<B, Q, A, ($($arg,)* Last,)> for F
        where
            F: FnOnce($($arg,)* Last) -> Fut,
            Fut: Future<Output = Result<A::Out, ApiError>>,
            A: ServerAnswer,
            Last: TakesBody<B>,
            list!($($arg,)* Last): QueryOf<Query = Q>,
        {
        }
    };
}

serves!();
serves!(T1);
serves!(T1, T2);
serves!(T1, T2, T3);
serves!(T1, T2, T3, T4);
serves!(T1, T2, T3, T4, T5);

/// The handler for the endpoint's method, if it serves the endpoint's types.
fn on<B, Q, A, H, T, Args>(endpoint: Endpoint<B, Q, A>, handler: H) -> MethodRouter<AppState>
where
    H: Handler<T, AppState> + Serves<B, Q, A, Args>,
    T: 'static,
{
    match endpoint.method {
        Method::Get => get(handler),
        Method::Post => post(handler),
        Method::Put => put(handler),
    }
}

/// `router.endpoint(routes::SUBMIT, experiments::submit)`: the endpoint's path and method
/// served by a handler of its types.
pub trait Endpoints {
    fn endpoint<B, Q, A, H, T, Args>(self, endpoint: Endpoint<B, Q, A>, handler: H) -> Self
    where
        H: Handler<T, AppState> + Serves<B, Q, A, Args>,
        T: 'static;
}

impl Endpoints for Router<AppState> {
    fn endpoint<B, Q, A, H, T, Args>(self, endpoint: Endpoint<B, Q, A>, handler: H) -> Self
    where
        H: Handler<T, AppState> + Serves<B, Q, A, Args>,
        T: 'static,
    {
        self.route(endpoint.path, on(endpoint, handler))
    }
}
