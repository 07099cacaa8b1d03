// Subscribing to a joblib room from a browser (or Node): the logic of
// index.html, kept in a module so that it can be tested without a browser.
//
// watchRoom connects with the API token in the CONNECT payload, joins
// room:{room} with join_room (again after every reconnect: rooms do not
// survive a new connection) and hands each room event to onEvent(name,
// payload). The events a room receives:
//   jobs_invalidate {}            the room's job list changed: refetch it
//   providers_invalidate {}       the room's provider list changed
//   task_status_event {id, name, room_id, status, created_at, started_at,
//                      completed_at, queue_position, worker_id, error}
//   provider_result_ready {provider_name, request_hash}
// onStatus(text) reports the connection's state.
export const ROOM_EVENTS = ["jobs_invalidate", "providers_invalidate", "task_status_event", "provider_result_ready"];

export function watchRoom(io, { url, token, room }, onEvent, onStatus = () => {}) {
  const socket = io(url, { auth: { token }, transports: ["websocket", "polling"] });
  socket.on("connect", async () => {
    const ack = await socket.timeout(10000).emitWithAck("join_room", { room_id: room });
    if (ack && ack.ok) {
      onStatus(`joined room ${room}`);
    } else {
      onStatus(`join refused: ${JSON.stringify(ack)}`);
    }
  });
  // "Unauthorized": a wrong token; a refused Origin shows as a transport
  // error here and as "socket refused: origin not allowed" in the server's log.
  socket.on("connect_error", (err) => onStatus(`connect error: ${err.message}`));
  socket.on("disconnect", (reason) => onStatus(`disconnected: ${reason}`));
  for (const name of ROOM_EVENTS) {
    socket.on(name, (payload) => onEvent(name, payload));
  }
  return socket;
}
