//! A JSON body with a deadline. actix-web's `Json` extractor waits for a body as long as the
//! client keeps the connection open; a client that declares 16 KiB and sends a byte every
//! few seconds would hold a connection (and a file descriptor) for hours. [`Body`] reads the
//! same way (the app's `JsonConfig`: size limit, content type, error format) but gives up
//! after `HTTP_REQUEST_TIMEOUT_MS` with 408 `request_timeout`, and the connection is closed.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// How long a handler waits for its body: the app's data, set from
/// `HTTP_REQUEST_TIMEOUT_MS` (5 s when an app was built without it).
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline(pub Duration);

const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// A JSON body of type `T`, read within the [`BodyDeadline`].
pub struct Body<T>(pub T);

impl<T> std::ops::Deref for Body<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: DeserializeOwned + 'static> FromRequest for Body<T> {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let deadline = req
            .app_data::<BodyDeadline>()
            .map_or(DEFAULT_DEADLINE, |deadline| deadline.0);
        let json = web::Json::<T>::from_request(req, payload);
        Box::pin(async move {
            // A body already in the buffer (every well-behaved purchase) is parsed on the first
            // poll, before the timer is ever registered.
            match actix_web::rt::time::timeout(deadline, json).await {
                Ok(parsed) => parsed.map(|json| Body(json.into_inner())),
                Err(_elapsed) => Err(ApiError::RequestTimeout.into()),
            }
        })
    }
}
