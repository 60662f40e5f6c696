package inspector

import (
	"errors"
	"net/http"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// DeleteRoutes adds the routes that delete captures and calls and mark
// captures to keep. They change state, so the Server's Origin and Host
// checks (and its token) stand before them, as before every route.
//
//	DELETE /api/v1/ext/webhooks/{id}/     a capture, its bodies, search entry and media
//	DELETE /api/v1/ext/calls/{call_id}/   every capture of a call, and the call's media
//	PUT    /api/v1/ext/webhooks/{id}/keep {"keep": bool}: retention leaves it, or not
func DeleteRoutes(mux *http.ServeMux, db *agentdb.AgentStore) {
	mux.HandleFunc("DELETE /api/v1/ext/webhooks/{id}/{$}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		ref, err := ResolveCapture(r.Context(), db, id) // a delivery id: every capture of it, as calltap delete
		if err != nil {
			api.WriteError(w, err)
			return
		}
		d, err := db.DeleteCaptures(r.Context(), ref.IDs()...)
		if err != nil {
			api.WriteError(w, err)
			return
		}
		if d.Captures == 0 {
			api.WriteError(w, api.NotFound("capture "+id))
			return
		}
		api.WriteData(w, http.StatusOK, "deleted", d)
	})
	mux.HandleFunc("DELETE /api/v1/ext/calls/{call_id}/{$}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("call_id")
		d, err := db.DeleteCall(r.Context(), id)
		if err != nil {
			api.WriteError(w, err)
			return
		}
		if d.Captures == 0 && d.Media == 0 {
			api.WriteError(w, api.NotFound("call "+id))
			return
		}
		api.WriteData(w, http.StatusOK, "deleted", d)
	})
	mux.HandleFunc("PUT /api/v1/ext/webhooks/{id}/keep", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Keep *bool `json:"keep"`
		}
		if err := api.DecodeJSON(w, r, 1<<10, &body); err != nil {
			api.WriteError(w, err)
			return
		}
		if body.Keep == nil {
			api.WriteError(w, api.Invalid("keep (true or false) is required"))
			return
		}
		id := r.PathValue("id")
		ref, err := ResolveCapture(r.Context(), db, id) // a delivery id: every capture of it, as calltap keep
		if err != nil {
			api.WriteError(w, err)
			return
		}
		for _, c := range ref.Captures {
			if err := db.SetKeep(r.Context(), c.ID, *body.Keep); errors.Is(err, storage.ErrNotFound) {
				api.WriteError(w, api.NotFound("capture "+c.ID))
				return
			} else if err != nil {
				api.WriteError(w, err)
				return
			}
		}
		api.WriteData(w, http.StatusOK, "ok", map[string]any{"id": id, "ids": ref.IDs(), "keep": *body.Keep})
	})
}
