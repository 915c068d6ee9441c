//! Binds each handler to its endpoint's declaration: [`on`] takes a handler only when what it
//! answers and the body it takes are the endpoint's (`routes::Endpoint`'s types), so a
//! handler, the client and the OpenAPI document cannot disagree about a route and compile.

use std::future::Future;

use axum::extract::{ConnectInfo, State};
use axum::handler::Handler;
use axum::response::Response;
use axum::routing::{MethodRouter, get, post, put};
use axum::{Extension, Router, body::Bytes};
use headroom_shared::routes::{
    Endpoint, Export, Json, JsonList, LogBytes, Method, NoBody, RawBytes,
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

/// An extractor that takes the body `B` (a body marker), or, for [`NoBody`], one that takes
/// none. A handler's last extractor is its body's, as axum wants it.
pub trait TakesBody<B> {}

impl<T> TakesBody<Json<T>> for ApiJson<T> {}
impl TakesBody<RawBytes> for Bytes {}
impl<S> TakesBody<NoBody> for State<S> {}
impl<T> TakesBody<NoBody> for Extension<T> {}
impl<T> TakesBody<NoBody> for ApiPath<T> {}
impl<T> TakesBody<NoBody> for ApiQuery<T> {}
impl<T> TakesBody<NoBody> for ConnectInfo<T> {}

/// A handler of `Args` that takes the body `B` and answers `A`.
pub trait Serves<B, A, Args> {}

impl<F, Fut, A> Serves<NoBody, A, ()> for F
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<A::Out, ApiError>>,
    A: ServerAnswer,
{
}

macro_rules! serves {
    ($($arg:ident),*) => {
        impl<F, Fut, B, A, $($arg,)* Last> Serves<B, A, ($($arg,)* Last,)> for F
        where
            F: FnOnce($($arg,)* Last) -> Fut,
            Fut: Future<Output = Result<A::Out, ApiError>>,
            A: ServerAnswer,
            Last: TakesBody<B>,
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
    H: Handler<T, AppState> + Serves<B, A, Args>,
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
        H: Handler<T, AppState> + Serves<B, A, Args>,
        T: 'static;
}

impl Endpoints for Router<AppState> {
    fn endpoint<B, Q, A, H, T, Args>(self, endpoint: Endpoint<B, Q, A>, handler: H) -> Self
    where
        H: Handler<T, AppState> + Serves<B, A, Args>,
        T: 'static,
    {
        self.route(endpoint.path, on(endpoint, handler))
    }
}
