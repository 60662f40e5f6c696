package callevent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// maxContactFile bounds a contact file: a contact is a few fields.
const maxContactFile = 1 << 20

// ReadContactFile reads a contact object from the JSON file at path
// (calltap trigger --contact-file), keeping the fields it does not know.
func ReadContactFile(path string) (Contact, error) {
	f, err := os.Open(path)
	if err != nil {
		return Contact{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxContactFile+1))
	if err != nil {
		return Contact{}, err
	}
	if len(b) > maxContactFile {
		return Contact{}, fmt.Errorf("%s: larger than 1 MiB", path)
	}
	var c Contact
	if err := json.Unmarshal(b, &c); err != nil {
		return Contact{}, fmt.Errorf("%s: want a JSON object with the contact's fields: %v", path, err)
	}
	return c, nil
}
