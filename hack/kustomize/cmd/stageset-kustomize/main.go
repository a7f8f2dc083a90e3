// Command stageset-kustomize builds kustomizations of a source tree held only in memory.
//
// Usage:
//
//	stageset-kustomize DIR...   < tree.tar
//	stageset-kustomize --patch  < patch.tar
//	stageset-kustomize --version   (the kustomize release it links)
//
// The controller sends the files a stage's build may read as a tar stream on stdin (regular
// files, and directories, which are skipped; names are clean paths relative to the source root).  They are placed under
// /artifact of an in-memory filesystem, and each DIR (relative to the source root) is built
// with kustomize's own library (sigs.k8s.io/kustomize/api/krusty, the engine behind
// `kustomize build`):
//
//   - loads are not restricted to each kustomization's directory (LoadRestrictionsNone, as
//     Flux does), because the filesystem itself holds nothing but the tree: a path that leaves
//     it, absolute or through "..", finds nothing, and no file of the machine is ever visible;
//   - builtin generators and transformers only (no exec, container or Go plugins, no Helm);
//   - no network: every HTTP request fails before it is sent, and the controller runs this
//     program with an empty PATH, so remote bases cannot be cloned either;
//   - the legacy sort order of `kustomize build`, unless a kustomization sets sortOptions.
//
// Output: the YAML of each build in turn, separated by "---" lines.  On failure: the error on
// stderr (paths relative to the source root) and exit status 1; bad input: exit status 2.
//
// --patch applies a stage's `patches` to objects already built: the tar holds resources.yaml
// (the objects) and patches.json (a list of {"patch": "...", "target": {...}} in kustomize's
// Patch shape).  Each patch in turn is applied by kustomize itself, as the only entry of a
// kustomization whose one resource is the output so far, so strategic merge and JSON 6902
// patches and target selectors behave exactly as in a kustomization, and a failure names the
// patch: "patches[2]: ...".  The objects keep their order.
package main

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/provenance"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const root = "/artifact"

// refuse is the transport of every HTTP client that does not bring its own: nothing leaves.
type refuse struct{}

func (refuse) RoundTrip(req *http.Request) (*http.Response, error) {
	return nil, fmt.Errorf("network access is disabled: %s", req.URL.Redacted())
}

func readTree(in io.Reader) (filesys.FileSystem, error) {
	fs := filesys.MakeFsInMemory()
	if err := fs.MkdirAll(root); err != nil {
		return nil, err
	}
	archive := tar.NewReader(bufio.NewReader(in))
	for {
		header, err := archive.Next()
		if errors.Is(err, io.EOF) {
			return fs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the tree: %w", err)
		}
		if header.Typeflag == tar.TypeDir {
			continue // directories exist through their files
		}
		if header.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("tree entry %q is not a regular file", header.Name)
		}
		name := header.Name
		if name == "" || strings.HasPrefix(name, "/") || path.Clean(name) != name || name == ".." ||
			strings.HasPrefix(name, "../") {
			return nil, fmt.Errorf("tree entry %q is not a clean relative path", name)
		}
		content, err := io.ReadAll(archive)
		if err != nil {
			return nil, fmt.Errorf("reading %q: %w", name, err)
		}
		if err := fs.WriteFile(path.Join(root, name), content); err != nil {
			return nil, fmt.Errorf("storing %q: %w", name, err)
		}
	}
}

func build(fs filesys.FileSystem, dir string) (out []byte, err error) {
	// kustomize can panic on malformed objects; that is a failed build, not a crash.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("kustomize failed unexpectedly: %v", r)
		}
	}()
	options := krusty.MakeDefaultOptions()
	options.LoadRestrictions = types.LoadRestrictionsNone
	options.PluginConfig = types.DisabledPluginConfig()
	options.Reorder = krusty.ReorderOptionLegacy
	resources, err := krusty.MakeKustomizer(options).Run(fs, path.Join(root, dir))
	if err != nil {
		return nil, err
	}
	return resources.AsYaml()
}

// stagePatch is one entry of a stage's `patches`, as the controller sends it.
type stagePatch struct {
	Patch  string          `json:"patch"`
	Target *types.Selector `json:"target,omitempty"`
}

const patchDir = "/patch"

func applyPatches(fs filesys.FileSystem) ([]byte, error) {
	resources, err := fs.ReadFile(path.Join(root, "resources.yaml"))
	if err != nil {
		return nil, fmt.Errorf("no resources.yaml: %w", err)
	}
	raw, err := fs.ReadFile(path.Join(root, "patches.json"))
	if err != nil {
		return nil, fmt.Errorf("no patches.json: %w", err)
	}
	var patches []stagePatch
	if err := json.Unmarshal(raw, &patches); err != nil {
		return nil, fmt.Errorf("patches.json: %w", err)
	}
	if err := fs.MkdirAll(patchDir); err != nil {
		return nil, err
	}
	current := resources
	for i, p := range patches {
		kustomization := types.Kustomization{
			TypeMeta:  types.TypeMeta{APIVersion: types.KustomizationVersion, Kind: types.KustomizationKind},
			Resources: []string{"resources.yaml"},
			Patches:   []types.Patch{{Patch: p.Patch, Target: p.Target}},
		}
		// JSON is YAML: kustomize reads the kustomization as it reads any other.
		content, err := json.Marshal(kustomization)
		if err != nil {
			return nil, err
		}
		if err := fs.WriteFile(path.Join(patchDir, "kustomization.yaml"), content); err != nil {
			return nil, err
		}
		if err := fs.WriteFile(path.Join(patchDir, "resources.yaml"), current); err != nil {
			return nil, err
		}
		out, err := patchOnce(fs)
		if err != nil {
			return nil, fmt.Errorf("patches[%d]: %s", i, strings.ReplaceAll(err.Error(), patchDir+"/", ""))
		}
		current = out
	}
	return current, nil
}

func patchOnce(fs filesys.FileSystem) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("kustomize failed unexpectedly: %v", r)
		}
	}()
	options := krusty.MakeDefaultOptions()
	options.LoadRestrictions = types.LoadRestrictionsRootOnly
	options.PluginConfig = types.DisabledPluginConfig()
	options.Reorder = krusty.ReorderOptionNone
	resources, err := krusty.MakeKustomizer(options).Run(fs, patchDir)
	if err != nil {
		return nil, err
	}
	return resources.AsYaml()
}

func relative(message string) string {
	return strings.ReplaceAll(strings.ReplaceAll(message, root+"/", ""), root, ".")
}

func main() {
	http.DefaultTransport = refuse{}
	dirs := os.Args[1:]
	if len(dirs) == 1 && dirs[0] == "--version" {
		fmt.Println(provenance.GetProvenance().Version)
		return
	}
	if len(dirs) == 0 {
		fmt.Fprintln(os.Stderr, "usage: stageset-kustomize DIR... < tree.tar | --patch < patch.tar")
		os.Exit(2)
	}
	fs, err := readTree(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if len(dirs) == 1 && dirs[0] == "--patch" {
		out, err := applyPatches(fs)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(out)
		return
	}
	stdout := bufio.NewWriter(os.Stdout)
	for i, dir := range dirs {
		clean := path.Clean(dir)
		if strings.HasPrefix(clean, "/") || clean == ".." || strings.HasPrefix(clean, "../") {
			fmt.Fprintf(os.Stderr, "build directory %q is not a clean relative path\n", dir)
			os.Exit(2)
		}
		out, err := build(fs, clean)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %s\n", clean, relative(err.Error()))
			os.Exit(1)
		}
		if i > 0 {
			stdout.WriteString("---\n")
		}
		stdout.Write(out)
	}
	if err := stdout.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
