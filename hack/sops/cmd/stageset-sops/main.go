// Command stageset-sops decrypts the SOPS-encrypted files of one stage, in memory, with the age
// and OpenPGP keys it is handed.
//
// Usage:
//
//	stageset-sops < request.tar > result.tar
//	stageset-sops --version
//
// The controller runs it only for a stage whose build reads SOPS-encrypted files, under the
// limits of its builds (time, memory, no network, an empty environment and no view of any
// file).  The request is a tar stream on stdin:
//
//   - request.json   {"files": {"<path>": "yaml"|"json"|"dotenv"|"ini"|"binary"}, "maxValues": N}
//   - keys/<entry>   one entry of the key Secret: "*.agekey" holds age identities (one or more
//     AGE-SECRET-KEY-1... lines, comments allowed), "*.asc" armored OpenPGP private keys
//   - files/<path>   the content of each file named in request.json
//
// The result is a tar stream on stdout, and nothing is ever written anywhere else:
//
//   - files/<path>   each file decrypted (SOPS metadata removed), in the same format; a file
//     without SOPS metadata is returned unchanged
//   - values.json    every value that was encrypted, as text (for the controller's redactor)
//   - error.json     instead of the above when a file cannot be decrypted:
//     {"file": "<path>", "reason": "..."}, exit status 1
//
// Decryption is SOPS' own (github.com/getsops/sops/v3: its stores, its AES-GCM cipher, its
// key groups and Shamir threshold, its MAC), with one key service that knows only the keys
// it was handed: age identities (filippo.io/age, as sops uses it) and OpenPGP private keys
// (ProtonMail/go-crypto: no gpg binary, no keyring).  Cloud KMS and Vault master keys are
// never asked: a file encrypted only for them fails with a reason that says so.  The MAC is
// always verified.  Reasons are fixed sentences: they name the file, key types, public
// recipients and Secret entry names, never a key, a value or a digest of a value.  SOPS' own
// log output is discarded.
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/getsops/sops/v3"
	"github.com/getsops/sops/v3/aes"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/cmd/sops/common"
	"github.com/getsops/sops/v3/cmd/sops/formats"
	"github.com/getsops/sops/v3/config"
	"github.com/getsops/sops/v3/keyservice"
	"github.com/getsops/sops/v3/logging"
	"github.com/getsops/sops/v3/version"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
)

type request struct {
	Files     map[string]string `json:"files"`
	MaxValues int               `json:"maxValues"`
}

type failure struct {
	File   string `json:"file"`
	Reason string `json:"reason"`
}

func (f *failure) Error() string { return f.File + ": " + f.Reason }

// refuse is the transport of every HTTP client that does not bring its own: nothing leaves.
type refuse struct{}

func (refuse) RoundTrip(req *http.Request) (*http.Response, error) {
	return nil, errors.New("network access is disabled")
}

// ---------------------------------------------------------------------------- keys

type keyService struct {
	age sopsage.ParsedIdentities
	pgp openpgp.EntityList
}

func loadKeys(entries map[string][]byte) (*keyService, error) {
	service := &keyService{}
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		content := entries[name]
		switch {
		case strings.HasSuffix(name, ".agekey"):
			var ids sopsage.ParsedIdentities
			if err := ids.Import(string(content)); err != nil {
				return nil, &failure{File: "", Reason: fmt.Sprintf("entry %q is not an age identity "+
					"file (lines AGE-SECRET-KEY-1..., comments starting with #)", name)}
			}
			service.age = append(service.age, ids...)
		case strings.HasSuffix(name, ".asc"):
			entities, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(content))
			if err != nil {
				return nil, &failure{Reason: fmt.Sprintf("entry %q is not an armored OpenPGP key "+
					"(gpg --export-secret-keys --armor)", name)}
			}
			for _, entity := range entities {
				if entity.PrivateKey == nil {
					return nil, &failure{Reason: fmt.Sprintf("entry %q holds a public key only; "+
						"export the private key (gpg --export-secret-keys --armor)", name)}
				}
				if entity.PrivateKey.Encrypted || encryptedSubkey(entity) {
					return nil, &failure{Reason: fmt.Sprintf("entry %q is protected by a "+
						"passphrase; store a private key without one", name)}
				}
			}
			service.pgp = append(service.pgp, entities...)
		}
	}
	return service, nil
}

func encryptedSubkey(entity *openpgp.Entity) bool {
	for _, subkey := range entity.Subkeys {
		if subkey.PrivateKey != nil && subkey.PrivateKey.Encrypted {
			return true
		}
	}
	return false
}

// Decrypt answers SOPS' request for one master key's share of the data key, with the keys
// handed in only.  Every other key type (cloud KMS, Vault) is refused without being asked.
func (s *keyService) Decrypt(_ context.Context, req *keyservice.DecryptRequest, _ ...grpc.CallOption) (
	*keyservice.DecryptResponse, error) {
	switch key := req.Key.KeyType.(type) {
	case *keyservice.Key_AgeKey:
		if len(s.age) == 0 {
			return nil, errors.New("no age identity")
		}
		master := &sopsage.MasterKey{Recipient: key.AgeKey.Recipient}
		master.SetEncryptedDataKey(req.Ciphertext)
		s.age.ApplyToMasterKey(master)
		plaintext, err := master.Decrypt()
		if err != nil {
			return nil, err
		}
		return &keyservice.DecryptResponse{Plaintext: plaintext}, nil
	case *keyservice.Key_PgpKey:
		if len(s.pgp) == 0 {
			return nil, errors.New("no OpenPGP key")
		}
		block, err := armor.Decode(bytes.NewReader(req.Ciphertext))
		if err != nil {
			return nil, err
		}
		message, err := openpgp.ReadMessage(block.Body, s.pgp, nil, nil)
		if err != nil {
			return nil, err
		}
		plaintext, err := io.ReadAll(io.LimitReader(message.UnverifiedBody, 1024))
		if err != nil {
			return nil, err
		}
		return &keyservice.DecryptResponse{Plaintext: plaintext}, nil
	default:
		return nil, errors.New("key type not used by this controller")
	}
}

func (s *keyService) Encrypt(context.Context, *keyservice.EncryptRequest, ...grpc.CallOption) (
	*keyservice.EncryptResponse, error) {
	return nil, errors.New("encryption is not supported")
}

// ---------------------------------------------------------------------------- decrypting

// recording decrypts with SOPS' AES-GCM cipher and keeps every plaintext value it returns.
type recording struct {
	cipher aes.Cipher
	values map[string]struct{}
	limit  int
	over   bool
}

func (r *recording) Encrypt(interface{}, []byte, string) (string, error) {
	return "", errors.New("encryption is not supported")
}

func (r *recording) Decrypt(ciphertext string, key []byte, additionalData string) (interface{}, error) {
	plaintext, err := r.cipher.Decrypt(ciphertext, key, additionalData)
	if err != nil {
		return nil, err
	}
	var text string
	switch value := plaintext.(type) {
	case sops.Comment:
		return plaintext, nil // comments are never applied
	case string:
		text = value
	case []byte:
		text = string(value)
	case int:
		text = strconv.Itoa(value)
	case float64:
		text = strconv.FormatFloat(value, 'f', -1, 64)
	case bool:
		text = strconv.FormatBool(value)
	default:
		text = fmt.Sprint(value)
	}
	if text != "" {
		if _, seen := r.values[text]; !seen {
			if len(r.values) >= r.limit {
				r.over = true
				return nil, errors.New("too many values")
			}
			r.values[text] = struct{}{}
		}
	}
	return plaintext, nil
}

var formatNames = map[string]formats.Format{
	"yaml": formats.Yaml, "json": formats.Json, "dotenv": formats.Dotenv, "ini": formats.Ini,
	"binary": formats.Binary,
}

func describeRecipients(metadata sops.Metadata) (usable []string, others map[string]bool) {
	others = map[string]bool{}
	for _, group := range metadata.KeyGroups {
		for _, key := range group {
			switch key.TypeToIdentifier() {
			case "age":
				usable = append(usable, "age "+key.ToString())
			case "pgp":
				usable = append(usable, "OpenPGP "+key.ToString())
			default:
				others[key.TypeToIdentifier()] = true
			}
		}
	}
	return usable, others
}

func listed(items []string) string {
	const most = 4
	if len(items) > most {
		return strings.Join(items[:most], ", ") + fmt.Sprintf(" and %d more", len(items)-most)
	}
	return strings.Join(items, ", ")
}

func decryptFile(name, formatName string, data []byte, keys *keyService, values *recording) ([]byte, error) {
	format, ok := formatNames[formatName]
	if !ok {
		return nil, &failure{File: name, Reason: fmt.Sprintf("unknown format %q", formatName)}
	}
	store := common.StoreForFormat(format, config.NewStoresConfig())
	tree, err := store.LoadEncryptedFile(data)
	if err != nil {
		if errors.Is(err, sops.MetadataNotFound) {
			return data, nil // not a SOPS file: untouched
		}
		return nil, &failure{File: name, Reason: fmt.Sprintf("cannot be read as a SOPS-encrypted %s file", formatName)}
	}
	usable, others := describeRecipients(tree.Metadata)
	if len(usable) == 0 {
		kinds := make([]string, 0, len(others))
		for kind := range others {
			kinds = append(kinds, kind)
		}
		sort.Strings(kinds)
		return nil, &failure{File: name, Reason: fmt.Sprintf("it is encrypted only for %s keys, which this "+
			"controller does not use (cloud KMS is not supported); add an age or OpenPGP recipient "+
			"(sops updatekeys)", strings.Join(kinds, ", "))}
	}
	dataKey, err := tree.Metadata.GetDataKeyWithKeyServices([]keyservice.KeyServiceClient{keys}, nil)
	if err != nil {
		return nil, &failure{File: name, Reason: fmt.Sprintf("no key matches the file's recipients (%s)",
			listed(usable))}
	}
	computed, err := tree.Decrypt(dataKey, values)
	if err != nil {
		if values.over {
			return nil, &failure{File: name, Reason: fmt.Sprintf("more than %d encrypted values in the stage "+
				"(the limit max_encrypted_values)", values.limit)}
		}
		return nil, &failure{File: name, Reason: "a value cannot be decrypted with the file's data key: the " +
			"file was changed after it was encrypted"}
	}
	stored, err := aes.NewCipher().Decrypt(tree.Metadata.MessageAuthenticationCode, dataKey,
		tree.Metadata.LastModified.Format(time.RFC3339))
	if err != nil {
		return nil, &failure{File: name, Reason: "MAC mismatch: the file's MAC cannot be decrypted (the file " +
			"was changed after it was encrypted)"}
	}
	storedText, ok := stored.(string)
	if !ok || subtle.ConstantTimeCompare([]byte(storedText), []byte(computed)) != 1 {
		return nil, &failure{File: name, Reason: "MAC mismatch: the file was changed after it was encrypted"}
	}
	plain, err := store.EmitPlainFile(tree.Branches)
	if err != nil {
		return nil, &failure{File: name, Reason: fmt.Sprintf("the decrypted file cannot be written as %s",
			formatName)}
	}
	return plain, nil
}

// ---------------------------------------------------------------------------- the streams

func readRequest(in io.Reader) (*request, map[string][]byte, map[string][]byte, error) {
	var req *request
	keys := map[string][]byte{}
	files := map[string][]byte{}
	archive := tar.NewReader(bufio.NewReader(in))
	for {
		header, err := archive.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("reading the request: %w", err)
		}
		if header.Typeflag != tar.TypeReg {
			return nil, nil, nil, fmt.Errorf("request entry %q is not a regular file", header.Name)
		}
		name := header.Name
		if path.Clean(name) != name || strings.HasPrefix(name, "/") || strings.Contains(name, "..") {
			return nil, nil, nil, fmt.Errorf("request entry %q is not a clean relative path", name)
		}
		content, err := io.ReadAll(archive)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("reading %q: %w", name, err)
		}
		switch {
		case name == "request.json":
			req = &request{}
			if err := json.Unmarshal(content, req); err != nil {
				return nil, nil, nil, fmt.Errorf("request.json: %w", err)
			}
		case strings.HasPrefix(name, "keys/"):
			keys[strings.TrimPrefix(name, "keys/")] = content
		case strings.HasPrefix(name, "files/"):
			files[strings.TrimPrefix(name, "files/")] = content
		default:
			return nil, nil, nil, fmt.Errorf("unexpected request entry %q", name)
		}
	}
	if req == nil {
		return nil, nil, nil, errors.New("no request.json")
	}
	return req, keys, files, nil
}

func writeEntry(archive *tar.Writer, name string, content []byte) error {
	if err := archive.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(content)),
		Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := archive.Write(content)
	return err
}

func run(in io.Reader, out io.Writer) (int, error) {
	req, keyEntries, files, err := readRequest(in)
	if err != nil {
		return 2, err
	}
	archive := tar.NewWriter(out)
	fail := func(f *failure) (int, error) {
		content, _ := json.Marshal(f)
		if err := writeEntry(archive, "error.json", content); err != nil {
			return 2, err
		}
		return 1, archive.Close()
	}
	keys, err := loadKeys(keyEntries)
	if err != nil {
		var f *failure
		if errors.As(err, &f) {
			return fail(f)
		}
		return 2, err
	}
	limit := req.MaxValues
	if limit <= 0 {
		limit = 1000
	}
	values := &recording{cipher: aes.NewCipher(), values: map[string]struct{}{}, limit: limit}
	names := make([]string, 0, len(req.Files))
	for name := range req.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	plain := make(map[string][]byte, len(names))
	for _, name := range names {
		data, ok := files[name]
		if !ok {
			return 2, fmt.Errorf("request names %q but holds no such file", name)
		}
		result, err := decryptFile(name, req.Files[name], data, keys, values)
		if err != nil {
			var f *failure
			if errors.As(err, &f) {
				return fail(f)
			}
			return 2, err
		}
		plain[name] = result
	}
	for _, name := range names {
		if err := writeEntry(archive, "files/"+name, plain[name]); err != nil {
			return 2, err
		}
	}
	texts := make([]string, 0, len(values.values))
	for text := range values.values {
		texts = append(texts, text)
	}
	sort.Strings(texts)
	content, err := json.Marshal(texts)
	if err != nil {
		return 2, err
	}
	if err := writeEntry(archive, "values.json", content); err != nil {
		return 2, err
	}
	return 0, archive.Close()
}

func main() {
	http.DefaultTransport = refuse{}
	// SOPS logs through logrus; nothing of it may reach a message (a warning can quote a comment).
	logging.SetLevel(logrus.PanicLevel)
	for _, logger := range logging.Loggers {
		logger.SetOutput(io.Discard)
	}
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println(version.Version)
		return
	}
	if len(os.Args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: stageset-sops < request.tar > result.tar")
		os.Exit(2)
	}
	stdout := bufio.NewWriter(os.Stdout)
	status, err := run(os.Stdin, stdout)
	if flushErr := stdout.Flush(); err == nil && flushErr != nil {
		err, status = flushErr, 2
	}
	if err != nil && status != 1 {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(status)
}
