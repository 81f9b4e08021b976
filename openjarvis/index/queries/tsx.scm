; Definitions and references for TypeScript (shared by TSX).
(class_declaration name: (type_identifier) @name) @definition.class
(abstract_class_declaration name: (type_identifier) @name) @definition.class
(interface_declaration name: (type_identifier) @name) @definition.interface
(type_alias_declaration name: (type_identifier) @name) @definition.type
(enum_declaration name: (identifier) @name) @definition.enum
(function_declaration name: (identifier) @name) @definition.function
(function_signature name: (identifier) @name) @definition.function
(generator_function_declaration name: (identifier) @name) @definition.function
(method_definition name: (property_identifier) @name) @definition.method
(method_signature name: (property_identifier) @name) @definition.method
(abstract_method_signature name: (property_identifier) @name) @definition.method
(module name: (identifier) @name) @definition.module
(lexical_declaration (variable_declarator name: (identifier) @name value: [(arrow_function) (function_expression)]) @definition.function)
(program (lexical_declaration (variable_declarator name: (identifier) @name value: [(string) (number) (object) (array) (call_expression) (new_expression) (as_expression)])) @definition.constant)
(program (export_statement (lexical_declaration (variable_declarator name: (identifier) @name value: [(string) (number) (object) (array) (call_expression) (new_expression) (as_expression)])) @definition.constant))
(call_expression function: (identifier) @reference.call)
(call_expression function: (member_expression property: (property_identifier) @reference.call))
(new_expression constructor: (identifier) @reference.type)
(import_specifier name: (identifier) @reference.import)
(type_annotation (type_identifier) @reference.type)
(generic_type name: (type_identifier) @reference.type)
(extends_clause value: (identifier) @reference.type)
(implements_clause (type_identifier) @reference.type)
(arguments (identifier) @reference.use)
