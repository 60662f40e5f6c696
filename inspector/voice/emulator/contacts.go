package emulator

import (
	"encoding/json"
	"net/http"
	"regexp"
	"sort"
	"strings"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage/servicedb"
)

// ContactItem is a contact record. The documentation does not show its
// fields; these are those of the call block's contact object (6.5) and
// created_at.
type ContactItem struct {
	ID           string          `json:"id"`
	Name         string          `json:"name"`
	Phone        string          `json:"phone"`
	Email        string          `json:"email"`
	CustomFields json.RawMessage `json:"custom_fields"`
	CreatedAt    *string         `json:"created_at"`
}

// pageParams are the recognised parameters of contact search; any other
// is a field filter (4.6).
var pageParams = map[string]bool{"limit": true, "offset": true}

var fieldNameRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

func (s *Server) listContacts(w http.ResponseWriter, r *http.Request) {
	s.contacts(w, r, false)
}

func (s *Server) searchContacts(w http.ResponseWriter, r *http.Request) {
	s.contacts(w, r, true)
}

func (s *Server) contacts(w http.ResponseWriter, r *http.Request, search bool) {
	q := r.URL.Query()
	limit, offset, err := api.ParsePage(q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var filters []servicedb.ContactFilter
	if search {
		names := make([]string, 0, len(q))
		for name := range q {
			if !pageParams[name] {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		for _, name := range names {
			f, err := s.contactFilter(r, name, q[name])
			if err != nil {
				s.fail(w, r, err)
				return
			}
			filters = append(filters, f)
		}
	}
	rows, count, err := s.db.ListContacts(r.Context(), filters, servicedb.Page{Limit: limit, Offset: offset})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	items := make([]ContactItem, 0, len(rows))
	for _, c := range rows {
		items = append(items, ContactItem{ID: c.ID, Name: c.Name, Phone: c.Phone, Email: c.Email,
			CustomFields: json.RawMessage(c.CustomFields), CreatedAt: api.Time(c.CreatedAt)})
	}
	api.WriteData(w, http.StatusOK, "", api.NewPage(count, limit, offset, items))
}

// contactFilter resolves a field filter: the name is matched against the
// contact's own fields first, then the organisation's custom fields in use.
// A name that is neither is refused, so that a typo does not pass for an
// empty result.
func (s *Server) contactFilter(r *http.Request, name string, values []string) (servicedb.ContactFilter, error) {
	f := servicedb.ContactFilter{Field: name, Values: values}
	if servicedb.IsContactColumn(name) {
		return f, nil
	}
	if !fieldNameRE.MatchString(name) {
		return f, api.Invalid("%q is not a contact field nor a custom field in use", name)
	}
	inUse, err := s.db.CustomFieldInUse(r.Context(), name)
	if err != nil {
		return f, err
	}
	if !inUse {
		return f, api.Invalid("%q is not a contact field (%s) nor a custom field in use", name, strings.Join(servicedb.ContactColumns(), ", "))
	}
	f.Custom = true
	return f, nil
}
